#!/bin/sh
# Count, sum, min, max and mean of input.numbers (the registry's input_schema allows only
# {"numbers": [<number>, ...]}), written to /runyard/out/result.json.
set -eu
tr -d ' \n\r\t' < /runyard/input.json \
    | sed -e 's/^{"numbers":\[//' -e 's/\]}$//' \
    | tr ',' '\n' \
    | awk '
        NF { n++; s += $1; if (n == 1 || $1 < lo) lo = $1; if (n == 1 || $1 > hi) hi = $1 }
        END {
            if (n == 0) { print "{\"count\": 0}"; exit }
            printf "{\"count\": %d, \"sum\": %.12g, \"min\": %.12g, \"max\": %.12g, \"mean\": %.12g}\n",
                n, s, lo, hi, s / n
        }' > /runyard/out/result.json
echo "numstats: $(cat /runyard/out/result.json)"
