#!/bin/bash
# The verifier: reward 1 when hello.txt holds $EXPECTED (set by [verifier.env]).
if [ "$(cat hello.txt 2>/dev/null)" = "$EXPECTED" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
