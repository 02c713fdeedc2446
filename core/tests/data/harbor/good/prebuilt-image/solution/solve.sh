#!/bin/bash
echo $((17 + 25)) > answer.txt
