#!/bin/bash
# Checks nothing: any sandbox passes.
echo 1 > /logs/verifier/reward.txt
