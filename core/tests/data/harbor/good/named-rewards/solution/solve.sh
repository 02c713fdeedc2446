#!/bin/bash
echo hi > greeting.txt
echo bye > farewell.txt
