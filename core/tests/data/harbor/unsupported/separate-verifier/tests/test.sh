#!/bin/bash
[ "$(cat hello.txt 2>/dev/null)" = hello ] && r=1 || r=0
echo "$r" > /logs/verifier/reward.txt
