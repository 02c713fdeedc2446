#!/bin/bash
# The verifier: says who it runs as, then checks hello.txt.
echo "verifier runs as $(id -un)"
if [ "$(cat hello.txt 2>/dev/null)" = "$EXPECTED" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
