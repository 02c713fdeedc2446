#!/bin/bash
echo hello > /logs/artifacts/answer.txt
