#!/bin/bash
mkdir -p /logs/artifacts && echo hello > /logs/artifacts/answer.txt
