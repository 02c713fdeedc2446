#!/bin/bash
# Runs the agent's run.sh (with the verifier's rights, as Harbor's verifiers do), then
# writes the reward: 1 when it printed "ok".
rm -f /tmp/run.out
[ -x run.sh ] && ./run.sh > /tmp/run.out 2>&1
[ "$(cat /tmp/run.out 2>/dev/null)" = ok ] && r=1 || r=0
echo "$r" > /logs/verifier/reward.txt
