#!/bin/sh
# node-problem-detector custom plugin (deploy/npd/smgshm-plugin-monitor.json): says the verdict that smgshm's
# exporter wrote after its last full scan (watch --node --npd-file FILE; smgshm/core/node/npdfile.py), since
# NPD's image has no Python. Usage: smgshm-npd.sh FILE MAX_AGE_SECONDS. NPD's contract: one line on stdout,
# exit 0 OK, 1 problem, 2 Unknown. The file is data, never code: at most 512 bytes of it are read (a NUL made
# a control character, which the shell would drop), each field must match its pattern, and its line is
# printed (with printf, never echo) only as printable ASCII of at most 80 characters. Unknown when it is missing, malformed, of another boot, or older than MAX_AGE_SECONDS
# by the boot clock (/proc/uptime). Tested under dash and busybox sh (tests/integration/test_npd_file.py).
LC_ALL=C
export LC_ALL
u() { printf 'smgshm: %s\n' "$1"; exit 2; }
f=$1 max=$2
case $max in '' | *[!0-9]* | ?????????*) u "usage: smgshm-npd.sh FILE MAX_AGE_SECONDS" ;; esac
{ [ -f "$f" ] && [ ! -L "$f" ]; } || u "no verdict file: is the smgshm exporter running with --npd-file?"
{ read -r magic boot ts st extra; IFS= read -r line; read -r more; } <<EOF
$(head -c 512 -- "$f" 2>/dev/null | tr '\000' '\001')
EOF
bad() { u "verdict file malformed"; }
{ [ "$magic" = smgshm-npd/1 ] && [ -z "$extra$more" ] && [ ${#line} -le 80 ]; } || bad
case $st in 0 | 1 | 2) ;; *) bad ;; esac
case $ts in '' | 0?* | *[!0-9]* | ?????????????*) bad ;; esac  # decimal, at most 12 digits
case $line in '' | *[!\ -~]*) bad ;; esac
read -r now _ </proc/uptime && read -r me </proc/sys/kernel/random/boot_id || u "cannot read the boot clock"
[ "$boot" = "$me" ] || u "verdict file from another boot: is the smgshm exporter running?"
age=$((${now%%.*} - ts))
[ "$age" -ge 0 ] || bad
[ "$age" -le "$max" ] || u "verdict ${age}s old (bound ${max}s): is the exporter running?"
printf '%s\n' "$line"
exit "$st"
