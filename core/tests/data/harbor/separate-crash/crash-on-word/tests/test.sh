#!/bin/bash
# Crashes (writes no reward) on the answer "crash": an artifact of the agent's breaks it.
answer=$(cat /logs/artifacts/answer.txt 2>/dev/null)
[ "$answer" = crash ] && exit 3
if [ "$answer" = hello ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
