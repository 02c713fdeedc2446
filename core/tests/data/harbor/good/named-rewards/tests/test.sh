#!/bin/bash
# Two named rewards: one per file, written to reward.json.
g=0; f=0
[ "$(cat greeting.txt 2>/dev/null)" = hi ] && g=1
[ "$(cat farewell.txt 2>/dev/null)" = bye ] && f=1
printf '{"greeting": %s, "farewell": %s}\n' "$g" "$f" > /logs/verifier/reward.json
