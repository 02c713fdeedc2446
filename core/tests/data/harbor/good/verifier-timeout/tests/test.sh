#!/bin/bash
# Runs the agent's run.sh: a script that never ends makes the verifier time out.
echo 0 > /logs/verifier/reward.txt
if [ -x run.sh ] && [ "$(./run.sh)" = done ]; then
  echo 1 > /logs/verifier/reward.txt
fi
