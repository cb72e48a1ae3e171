#!/bin/sh
# fleet/remote/preflight.sh: node-side checks before a launch, shipped by `fleet preflight`.
#
# fleet runs it over SSH with the script on stdin, under a deadline:
#
#     [timeout N] sh -s -- --dir DIR --rank N --port P --min-free-gb G --min-shm-gb S \
#         [--pattern ERE ...] [--path GLOB ...] < preflight.sh
#     sh -s -- classify-fs TYPE < preflight.sh    (the verdict for one filesystem type)
#
# Every check prints one line, `ok|warn|fail  CHECK: reason` (the verdict padded to
# four characters, then two spaces): ok and warn on stdout, fail on stderr (only there:
# fleet's end-of-run summary shows a failed host's stderr tail, and a line on both
# streams would be shown twice as it happens). The last stdout line
# is `preflight: N ok, N warn, N fail`. Exit 1 if any check failed, 0 otherwise, 2 on
# bad usage (the reason on stderr).
#
#   dir        DIR (leading ~ = the login user's home, as in cleanup.sh) exists, is a
#              directory and is writable: a temp file is really created and removed.
#   fs         its filesystem (`stat -f -c %T`; the mount's type, source and mount point
#              from `findmnt -T` when installed, else /proc/self/mountinfo): network
#              filesystems and container overlays fail (PITFALLS 18), tmpfs/ramfs and
#              unknown FUSE filesystems warn, local disk filesystems are ok.
#   free       free space on that filesystem (df -Pk) >= --min-free-gb.
#   port       rank 0 only: nothing LISTENs on --port (PITFALLS 17), with the holder named.
#   leftovers  cleanup.sh's `verify` with the patterns and paths: leftovers warn.
#   shm        /dev/shm is at least --min-shm-gb (Docker's default is 64 MB).
#
# When DIR does not exist, fs and free look at its nearest existing parent (where it
# would be created) and say so. Sizes: 1 GB = 1024^3 bytes, as df -h counts.
#
# The port and leftover checks reuse cleanup.sh's /proc scanning (self-exclusion, socket
# owners, in-use paths) instead of a second copy: fleet replaces the include line below
# with `CLEANUP_SH=<text of cleanup.sh>` when it sends this script. Run by hand without
# fleet, those two checks say "not checked".
#
# Portability: POSIX sh (dash, bash, busybox ash); coreutils-level tools (stat, df, sed,
# tr, rm, cat) and, when present, findmnt. No python, no ps/ss/fuser (PITFALLS 5).

# fleet:include cleanup.sh as CLEANUP_SH

LC_ALL=C
export LC_ALL
NL='
'
DEFAULT_IFS=' 	
'
IFS=$DEFAULT_IFS
KB_PER_GB=1048576

usage() {
    cat <<'EOF'
usage: sh -s -- --dir DIR [--rank N] [--port P] [--min-free-gb G] [--min-shm-gb S]
                [--pattern ERE ...] [--path GLOB ...] < preflight.sh
       sh -s -- classify-fs TYPE < preflight.sh
EOF
}

die_usage() {
    printf 'preflight.sh: %s\n' "$1" >&2
    usage >&2
    exit 2
}

N_OK=0 N_WARN=0 N_FAIL=0

# report VERDICT CHECK REASON: one result line, on stdout; a fail line on stderr instead.
report() {
    case $1 in
    ok) N_OK=$((N_OK + 1)) ;;
    warn) N_WARN=$((N_WARN + 1)) ;;
    fail)
        N_FAIL=$((N_FAIL + 1))
        printf '%-4s  %s: %s\n' "$1" "$2" "$3" >&2
        return
        ;;
    esac
    printf '%-4s  %s: %s\n' "$1" "$2" "$3"
}

# plural N WORD: "1 process", "2 processes", "0 paths".
plural() {
    case $1:$2 in
    1:*) printf '%s %s' "$1" "$2" ;;
    *:process) printf '%s processes' "$1" ;;
    *) printf '%s %ss' "$1" "$2" ;;
    esac
}

# strip_zeros NUMBER: NUMBER without leading zeros ($((08)) is an error in sh).
strip_zeros() {
    sz_n=$1
    while :; do
        case $sz_n in 0?*) sz_n=${sz_n#0} ;; *) break ;; esac
    done
    printf '%s' "$sz_n"
}

# gb_to_kb VALUE: KB = VALUE gigabytes (maybe fractional, 3 decimals kept) in KiB.
gb_to_kb() {
    case $1 in '' | . | *[!0-9.]* | *.*.*) return 1 ;; esac
    gk_int=$(strip_zeros "${1%%.*}") gk_frac=
    case $1 in *.*) gk_frac=${1#*.} ;; esac
    [ "${#gk_int}" -le 9 ] || return 1
    gk_frac=$(printf '%.3s' "${gk_frac}000")
    gk_frac=$(strip_zeros "$gk_frac")
    KB=$((${gk_int:-0} * KB_PER_GB + gk_frac * KB_PER_GB / 1000))
}

# human KB: "64 MB" below 1 GB, else "12.3 GB".
human() {
    if [ "$1" -lt "$KB_PER_GB" ]; then
        printf '%s MB' $(($1 / 1024))
        return 0
    fi
    hu_tenths=$((($1 * 10 + KB_PER_GB / 2) / KB_PER_GB))
    printf '%s.%s GB' $((hu_tenths / 10)) $((hu_tenths % 10))
}

# login_home: the home of the user who logged in (under sudo, not root's), as cleanup.sh.
login_home() {
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        lh=$(getent passwd "$SUDO_USER" 2>/dev/null | cut -d: -f6)
        if [ -n "$lh" ]; then
            printf '%s\n' "$lh"
            return
        fi
    fi
    printf '%s\n' "${HOME:-}"
}

# run_cleanup ARGS...: cleanup.sh (included by fleet) with ARGS, fed on stdin as fleet does.
# Its own /proc scan leaves us (its parent) and our session out, as it does for fleet's shell.
run_cleanup() {
    printf '%s\n' "$CLEANUP_SH" | sh -s -- "$@"
}

# ------------------------------------------------------------------ filesystems

# classify_fs TYPE: FS_VERDICT (ok|warn|fail) and FS_WHY for a filesystem type, as GNU
# `stat -f -c %T` prints it (ext2/ext3, nfs, smb2, fuseblk, overlayfs, UNKNOWN (0x...))
# or as the mount table names it (ext4, nfs4, cifs, fuse.sshfs, overlay).
classify_fs() {
    cf_type=$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')
    case $cf_type in
    nfs | nfs3 | nfs4 | cifs | smb | smbfs | smb2 | smb3 | lustre | gpfs | beegfs | fhgfs | \
        glusterfs | ceph | afs | k-afs | kafs | coda | 9p | v9fs | novell | ncpfs | ocfs2 | \
        gfs | gfs2 | gfs/gfs2 | panfs | ibrix | acfs | snfs | wekafs | orangefs | pvfs2 | \
        sshfs | s3fs | davfs | fuse.sshfs | fuse.glusterfs | fuse.ceph | fuse.ceph-fuse | \
        fuse.s3fs | fuse.gcsfuse | fuse.rclone | fuse.juicefs | fuse.goofys | fuse.blobfuse | \
        fuse.blobfuse2 | fuse.mfs | fuse.moosefs | fuse.lizardfs | fuse.quobyte | fuse.cvmfs2 | \
        fuse.beegfs | fuse.davfs | fuse.weka)
        FS_VERDICT=fail
        FS_WHY='network filesystem: checkpoint storms on network storage stall the node; use node-local disk'
        ;;
    overlay | overlayfs | aufs | fuse-overlayfs | fuse.fuse-overlayfs)
        FS_VERDICT=fail
        FS_WHY='container overlay: checkpoints fill the root disk; mount node-local storage into the container'
        ;;
    tmpfs | ramfs)
        FS_VERDICT=warn
        FS_WHY='node-local but RAM: checkpoints use memory and are gone after a reboot'
        ;;
    fuse | fuseblk | fuse.*)
        FS_VERDICT=warn
        FS_WHY='unknown FUSE filesystem: make sure it is node-local'
        ;;
    ext2/ext3 | ext2 | ext3 | ext4 | ext4dev | xfs | btrfs | zfs | f2fs | jfs | reiserfs | bcachefs)
        FS_VERDICT=ok
        FS_WHY='node-local disk'
        ;;
    *)
        FS_VERDICT=warn
        FS_WHY='unrecognised filesystem type: make sure it is node-local disk'
        ;;
    esac
}

# mount_of PATH: MNT_TYPE, MNT_SOURCE, MNT_TARGET of the mount holding PATH (empty when
# neither findmnt nor /proc/self/mountinfo can tell). The mount table names FUSE
# subtypes (fuse.sshfs) that statfs cannot: every FUSE mount reads "fuseblk" there.
mount_of() {
    MNT_TYPE='' MNT_SOURCE='' MNT_TARGET=''
    if command -v findmnt >/dev/null 2>&1; then
        # -r escapes blanks in values (\x20), so the three fields split cleanly.
        mo_line=$(findmnt -n -r -o FSTYPE,SOURCE,TARGET -T "$1" 2>/dev/null | sed -n 1p)
        read -r MNT_TYPE MNT_SOURCE MNT_TARGET <<EOF
$mo_line
EOF
        [ -z "$MNT_TYPE" ] || return 0
    fi
    mountinfo_of "$1"
}

# mountinfo_of PATH: the same from /proc/self/mountinfo: the longest mount point that
# holds PATH's real path (the last one listed wins: it is mounted over the others).
# Mount points there escape blanks and backslashes as octal (\040); so does our key.
mountinfo_of() {
    [ -r /proc/self/mountinfo ] || return 0
    mi_real=$(cd -P -- "$1" 2>/dev/null && pwd -P) || return 0
    mi_key=$(printf '%s\n' "$mi_real" | sed 's/\\/\\134/g; s/ /\\040/g; s/	/\\011/g')
    mi_best=-1
    set -f
    while read -r _ _ _ _ mi_point mi_rest; do
        case $mi_key/ in "${mi_point%/}"/*) ;; *) continue ;; esac
        [ "${#mi_point}" -ge "$mi_best" ] || continue
        mi_best=${#mi_point}
        # after the optional fields: " - FSTYPE SOURCE SUPEROPTIONS"
        # shellcheck disable=SC2086  # split the fields: wanted
        set -- ${mi_rest#* - }
        MNT_TYPE=${1:-} MNT_SOURCE=${2:-} MNT_TARGET=$mi_point
    done </proc/self/mountinfo
    set +f
}

# unescape_mount TEXT: a mount table value for humans: blanks and backslashes come escaped
# as \040 \011 \134 from /proc/self/mountinfo and as \x20 \x09 \x5c from `findmnt -r`.
unescape_mount() {
    printf '%s\n' "$1" | sed 's/\\040/ /g; s/\\x20/ /g; s/\\011/	/g; s/\\x09/	/g; s/\\134/\\/g; s/\\x5c/\\/g'
}

# existing_dir PATH: EXISTING = PATH if it is a directory, else its nearest existing
# parent directory ("." for a relative path with none).
existing_dir() {
    EXISTING=$1
    ed_hops=0
    while [ ! -d "$EXISTING" ] && [ "$ed_hops" -lt 4096 ]; do
        case $EXISTING in
        */*)
            EXISTING=${EXISTING%/*}
            [ -n "$EXISTING" ] || EXISTING=/
            ;;
        *) EXISTING=. ;;
        esac
        ed_hops=$((ed_hops + 1))
    done
}

# ---------------------------------------------------------------------- checks

check_dir() {
    if [ -z "$DIR" ]; then
        report fail dir "no output directory given (--dir is empty)"
    elif [ ! -e "$DIR" ] && [ -L "$DIR" ]; then
        report fail dir "$DIR is a symlink to nothing on this node"
    elif [ ! -e "$DIR" ]; then
        report fail dir "$DIR does not exist on this node"
    elif [ ! -d "$DIR" ]; then
        report fail dir "$DIR exists but is not a directory"
    else
        # Really write: permission bits say nothing about a read-only mount, and root
        # passes every permission test anyway.
        cd_probe=${DIR%/}/.fleet-preflight.$$
        if cd_err=$( (set -C && : >"$cd_probe") 2>&1); then
            if rm -f -- "$cd_probe" 2>/dev/null && [ ! -e "$cd_probe" ]; then
                report ok dir "$DIR is a writable directory"
            else
                report fail dir "$DIR: created $cd_probe but could not remove it"
            fi
        else
            cd_err=${cd_err##*: }
            report fail dir "$DIR is not writable (${cd_err:-cannot create a file})"
        fi
    fi
    # fs and free look where the checkpoints would land: DIR, or where it would be created.
    existing_dir "${DIR:-.}"
    WHERE=$DIR
    [ "$EXISTING" = "$DIR" ] || WHERE="$EXISTING (nearest existing parent of $DIR)"
}

check_fs() {
    cf_stat=''
    if command -v stat >/dev/null 2>&1; then
        cf_stat=$(stat -f -c %T -- "$EXISTING" 2>/dev/null)
    fi
    mount_of "$EXISTING"
    cf_type=${MNT_TYPE:-$cf_stat}
    if [ -z "$cf_type" ]; then
        report warn fs "cannot tell the filesystem type of $WHERE (no stat, findmnt or /proc/self/mountinfo)"
        return 0
    fi
    classify_fs "$cf_type"
    cf_where=
    if [ -n "$MNT_TARGET" ]; then
        cf_where=" ($(unescape_mount "${MNT_SOURCE:-?}") mounted at $(unescape_mount "$MNT_TARGET"))"
    fi
    report "$FS_VERDICT" fs "$WHERE is on $cf_type$cf_where: $FS_WHY"
}

# df_kb PATH: DF_TOTAL and DF_AVAIL in KiB for PATH's filesystem; false if df cannot tell.
df_kb() {
    DF_TOTAL='' DF_AVAIL=''
    df_line=$(df -Pk -- "$1" 2>/dev/null | sed -n 2p)
    set -f
    # shellcheck disable=SC2086  # split the columns: wanted
    set -- $df_line
    set +f
    [ "$#" -ge 4 ] || return 1
    case $2$4 in '' | *[!0-9]*) return 1 ;; esac
    DF_TOTAL=$2 DF_AVAIL=$4
}

check_free() {
    if ! df_kb "$EXISTING"; then
        report warn free "df -Pk cannot tell the free space of $WHERE"
        return 0
    fi
    cf_have=$(human "$DF_AVAIL")
    if [ "$DF_AVAIL" -ge "$MIN_FREE_KB" ]; then
        report ok free "$cf_have free on $WHERE (>= $MIN_FREE_GB GB)"
    else
        report fail free "only $cf_have free on $WHERE, $MIN_FREE_GB GB required ($DF_AVAIL KB available)"
    fi
}

check_port() {
    if [ "$RANK" -ne 0 ]; then
        report ok port "not checked (rank $RANK)"
        return 0
    fi
    if [ -z "$PORT" ]; then
        report ok port "not checked (no --port)"
        return 0
    fi
    if [ -z "${CLEANUP_SH:-}" ]; then
        report warn port "port $PORT not checked: cleanup.sh was not included (run through fleet)"
        return 0
    fi
    cp_out=$(run_cleanup verify --port "$PORT" 2>&1)
    cp_rc=$?
    case $cp_rc in
    0)
        report ok port "port $PORT is free"
        return 0
        ;;
    1) ;;
    *)
        report warn port "port $PORT not checked: cleanup.sh verify exit $cp_rc: $(printf '%s\n' "$cp_out" | sed -n 1p)"
        return 0
        ;;
    esac
    cp_holders=''
    cp_nobody=''
    while IFS= read -r cp_line; do
        case $cp_line in
        "left port $PORT: held by a socket no visible process owns"*) cp_nobody=1 ;;
        "left port $PORT: held by "*) cp_holders="$cp_holders${cp_holders:+, }${cp_line#"left port $PORT: held by "}" ;;
        esac
    done <<EOF
$cp_out
EOF
    if [ -n "$cp_holders" ]; then
        cp_who="by $cp_holders"
    elif [ -n "$cp_nobody" ]; then
        cp_who="by a socket no visible process owns (another user's or another container's?)"
    else
        cp_who="($(printf '%s\n' "$cp_out" | sed -n '$p'))"
    fi
    report fail port "port $PORT is already in use $cp_who: the rendezvous would collide; free it (fleet cleanup) or pick another port"
}

check_leftovers() {
    if [ -z "$PATTERNS$PATHS" ]; then
        report ok leftovers "not checked (no --pattern or --path)"
        return 0
    fi
    if [ -z "${CLEANUP_SH:-}" ]; then
        report warn leftovers "not checked: cleanup.sh was not included (run through fleet)"
        return 0
    fi
    set -- verify
    set -f
    IFS=$NL
    for cl_item in $PATTERNS; do
        set -- "$@" --pattern "$cl_item"
    done
    for cl_item in $PATHS; do
        set -- "$@" --path "$cl_item"
    done
    IFS=$DEFAULT_IFS
    set +f
    cl_out=$(run_cleanup "$@" 2>&1)
    cl_rc=$?
    case $cl_rc in
    0)
        report ok leftovers "no training process or torch/CUDA state left"
        return 0
        ;;
    1) ;;
    *)
        report fail leftovers "$(printf '%s\n' "$cl_out" | sed -n 1p)"
        return 0
        ;;
    esac
    cl_procs=0 cl_paths=0
    while IFS= read -r cl_line; do
        case $cl_line in
        'left process '*) cl_procs=$((cl_procs + 1)) ;;
        'left path: '*) cl_paths=$((cl_paths + 1)) ;;
        esac
    done <<EOF
$cl_out
EOF
    report warn leftovers "leftover training processes or torch state ($(plural "$cl_procs" process), $(plural "$cl_paths" path)): run fleet cleanup"
}

check_shm() {
    if [ ! -d /dev/shm ]; then
        report warn shm "/dev/shm does not exist: NCCL and DataLoader workers need shared memory"
        return 0
    fi
    if ! df_kb /dev/shm; then
        report warn shm "df -Pk cannot tell the size of /dev/shm"
        return 0
    fi
    cs_size=$(human "$DF_TOTAL")
    if [ "$DF_TOTAL" -lt "$MIN_SHM_KB" ]; then
        report warn shm "/dev/shm is only $cs_size (< $MIN_SHM_GB GB): Docker's default 64 MB breaks NCCL and DataLoader workers; give the container --shm-size or --ipc=host"
    else
        report ok shm "/dev/shm is $cs_size (>= $MIN_SHM_GB GB)"
    fi
}

# -------------------------------------------------------------------- options

# one_line OPTION VALUE: refuse empty or multi-line values.
one_line() {
    [ -n "$2" ] || die_usage "$1 must not be empty"
    case $2 in *"$NL"*) die_usage "$1 must be a single line" ;; esac
}

parse_args() {
    DIR='' DIR_SET='' RANK=0 PORT='' MIN_FREE_GB=0 MIN_SHM_GB=0 PATTERNS='' PATHS=''
    while [ "$#" -gt 0 ]; do
        case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --dir | --rank | --port | --min-free-gb | --min-shm-gb | --pattern | --path) ;;
        *) die_usage "unknown option: $1" ;;
        esac
        [ "$#" -ge 2 ] || die_usage "$1 needs a value"
        case $1 in
        --dir)
            case $2 in *"$NL"*) die_usage "--dir must be a single line" ;; esac
            DIR=$2 DIR_SET=1
            ;;
        --rank)
            case $2 in '' | *[!0-9]*) die_usage "--rank needs a number, got: $2" ;; esac
            [ "${#2}" -le 9 ] || die_usage "--rank is too large: $2"
            RANK=$(strip_zeros "$2")
            ;;
        --port)
            case $2 in '' | *[!0-9]*) die_usage "--port needs a number, got: $2" ;; esac
            if [ "${#2}" -gt 6 ] || [ "$2" -lt 1 ] || [ "$2" -gt 65535 ]; then
                die_usage "--port must be 1-65535, got: $2"
            fi
            PORT=$(strip_zeros "$2")
            ;;
        --min-free-gb)
            gb_to_kb "$2" || die_usage "--min-free-gb needs a number of GB (e.g. 50 or 0.5), got: $2"
            MIN_FREE_GB=$2
            ;;
        --min-shm-gb)
            gb_to_kb "$2" || die_usage "--min-shm-gb needs a number of GB (e.g. 1 or 0.5), got: $2"
            MIN_SHM_GB=$2
            ;;
        --pattern)
            one_line --pattern "$2"
            PATTERNS="$PATTERNS$2$NL"
            ;;
        --path)
            one_line --path "$2"
            PATHS="$PATHS$2$NL"
            ;;
        esac
        shift 2
    done
    [ -n "$DIR_SET" ] || die_usage "--dir is required"
    gb_to_kb "$MIN_FREE_GB"
    MIN_FREE_KB=$KB
    gb_to_kb "$MIN_SHM_GB"
    MIN_SHM_KB=$KB
    # shellcheck disable=SC2088  # a literal "~" from fleet: we expand it
    case $DIR in
    '~' | '~/'*)
        pa_home=$(login_home)
        [ -n "$pa_home" ] || die_usage "--dir $DIR: HOME is not set"
        case $DIR in '~') DIR=$pa_home ;; *) DIR=${pa_home%/}/${DIR#'~/'} ;; esac
        ;;
    esac
}

main() {
    exec </dev/null # the script itself arrives on stdin: keep children off it
    case ${1:-} in
    classify-fs)
        [ "$#" -eq 2 ] || die_usage "classify-fs takes one filesystem type"
        classify_fs "$2"
        printf '%-4s  fs: %s: %s\n' "$FS_VERDICT" "$2" "$FS_WHY"
        return 0
        ;;
    help)
        usage
        return 0
        ;;
    esac
    parse_args "$@"
    check_dir
    check_fs
    check_free
    check_port
    check_leftovers
    check_shm
    printf 'preflight: %s ok, %s warn, %s fail\n' "$N_OK" "$N_WARN" "$N_FAIL"
    [ "$N_FAIL" -eq 0 ]
}

main "$@"; exit "$?"
