#!/bin/bash
echo hello > /app/result.txt && mkdir -p /logs/artifacts && echo hello > /logs/artifacts/answer.txt
