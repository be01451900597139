# shellcheck shell=bash
# scripts/lib/debian.sh — helpers for scripts that make a Debian rootfs with debootstrap
# (for machines that cannot pull images). Source it from bash; it defines functions only
# and sets nothing else.
#
#   debian_mirror SUITE          print the Debian mirror to use for SUITE: RUNYARD_DEBIAN_MIRROR,
#                                else read at run time from this machine's apt sources
#                                (deb822 /etc/apt/sources.list.d/*.sources and one-line
#                                /etc/apt/sources.list{,.d/*.list}); empty when none found
#   debian_need_debootstrap LOG  install debootstrap + debian-archive-keyring with apt when
#                                missing (root only); LOG is a function taking a message
#   debian_rootfs_stop_procs DIR kill processes whose root is DIR (a postinst may start one)
#   debian_rootfs_remove DIR     unmount whatever is mounted below DIR, then remove it
#
# The mirror logic is the same as scripts/postgres-standin/build's (which still carries its
# own copy, so that its inputs hash, and hence the stand-in image, did not change).
# Never write a mirror's host name into a file: it comes from the machine, at run time.

# Prints "URI<TAB>suite suite ..." for each enabled `deb` source.
debian_apt_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk 'function flush() { if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled != "no" && uris != "")
                                   { n = split(uris, u, /[ \t]+/); for (i = 1; i <= n; i++) if (u[i] != "") print u[i] "\t" suites }
                               types = uris = suites = ""; enabled = "" }
             /^[ \t]*#/ { next }
             /^[ \t]*$/ { flush(); next }
             { line = $0; key = tolower(line); sub(/:.*/, "", key); val = line; sub(/^[^:]*:[ \t]*/, "", val) }
             key == "types" { types = val } key == "uris" { uris = val }
             key == "suites" { suites = val } key == "enabled" { enabled = tolower(val) }
             END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                           if (i + 1 <= NF) print $i "\t" $(i + 1) }' "$f"
    done
}

debian_mirror() {
    local suite=$1 uri suites best="" any=""
    if [[ -n "${RUNYARD_DEBIAN_MIRROR:-}" ]]; then
        echo "$RUNYARD_DEBIAN_MIRROR"
        return 0
    fi
    while IFS=$'\t' read -r uri suites; do
        [[ "$uri" =~ ^(https?|file):// ]] || continue
        uri="${uri%/}"
        if [[ " $suites " == *" $suite "* ]]; then best=$uri; break; fi
        # A main archive of another release (no "-security"/"-updates" suffix) serves $suite too.
        if [[ -z "$any" && "$uri" != *security* && " $suites " =~ \ [a-z]+\  ]]; then
            any=$uri
        fi
    done < <(debian_apt_sources)
    echo "${best:-$any}"
}

debian_need_debootstrap() {
    local log_fn=$1 need=()
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    [[ -s /usr/share/keyrings/debian-archive-keyring.gpg ]] || need+=(debian-archive-keyring)
    ((${#need[@]})) || return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        "$log_fn" "ERROR: need ${need[*]} and there is no apt-get here"
        return 1
    fi
    "$log_fn" "installing ${need[*]} with apt ..."
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${need[@]}" >&2
}

debian_rootfs_stop_procs() {
    local rootfs=$1 p
    for p in /proc/[0-9]*; do
        if [[ "$(readlink "$p/root" 2>/dev/null || true)" == "$rootfs" ]]; then
            kill -9 "${p#/proc/}" 2>/dev/null || true
        fi
    done
}

debian_rootfs_remove() {
    local dir=$1 m
    [[ -n "$dir" && -d "$dir" ]] || return 0
    # Deepest mounts first; debootstrap mounts /proc and /sys inside the rootfs.
    while read -r m; do umount -l "$m" 2>/dev/null || true; done \
        < <(awk -v r="$dir" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r)
    rm -rf --one-file-system "$dir"
}
