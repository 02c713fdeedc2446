#!/bin/bash
[ "$(tr -d '[:space:]' < answer.txt 2>/dev/null)" = 42 ] && r=1 || r=0
echo "$r" > /logs/verifier/reward.txt
