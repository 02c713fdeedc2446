#!/bin/bash
# Runs in the image tests/Dockerfile builds (it has /verifier-image, the agent's has not),
# given the agent's /app/result.txt and /logs/artifacts.
if [ -f /verifier-image ] && [ "$(cat /app/result.txt 2>/dev/null)" = hello ] \
    && [ "$(cat /logs/artifacts/answer.txt 2>/dev/null)" = hello ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
