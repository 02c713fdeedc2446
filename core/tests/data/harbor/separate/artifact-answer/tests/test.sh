#!/bin/bash
# A separate verifier: it sees the agent's /logs/artifacts, never the agent's other files
# (leak.txt, which the tests' agent also writes into its working directory).
expected=$(cat /tests/expected.txt)
if [ "$(cat /logs/artifacts/answer.txt 2>/dev/null)" = "$expected" ] && [ ! -e leak.txt ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
