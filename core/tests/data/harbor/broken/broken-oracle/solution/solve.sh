#!/bin/bash
# Wrong: writes the greeting into the wrong file.
echo hello > greeting.txt
