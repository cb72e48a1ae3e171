#!/bin/sh
# tests/cluster/docker_shim.sh: a stand-in for the `docker` CLI on sandbox nodes.
#
# No Docker engine can run here, so tests/cluster/test_kill_docker.py installs this file as
# `docker` in a node's bin dir (mounted over the node's /usr/local/bin, so it is on the PATH).
# It implements the subset of the CLI that fleet's kill-docker uses, plus `run` to make
# containers, with the same output formats and error messages as the real client.
#
# A "container" is real isolation, not bookkeeping: a child PID + mount namespace of the node
# (`unshare --pid --fork --kill-child --mount-proc`), started detached. Processes inside see only
# their own /proc; `docker exec` enters the container with nsenter, so killing the exec client
# does not kill what it started, exactly as with Docker (docker/cli#5309). The root file system is
# the node's (there are no images).
#
#   docker run -d [--name N] [-l|--label K=V]... [--pid host] IMAGE CMD [ARG...]
#   docker ps [-a] [-q] [--no-trunc] [-f|--filter label=K[=V]]... [--format TEMPLATE]
#       TEMPLATE fields: {{.ID}} {{.Names}} {{.Image}} {{.State}} {{.Labels}} (k=v,k2=v2);
#       "\t" and "\n" in it become a tab and a newline, as in docker.
#   docker exec [-i] [-d] [-u 0|root] CONTAINER CMD [ARG...]
#   docker stop [-t|--time SECONDS] CONTAINER...
#   anything else: "not supported by the fleet test shim", exit 1.
#
# State lives on the node in $FAKE_DOCKER_STATE (default /run/fake-docker, a tmpfs private to the
# node): containers/NAME/{id,name,image,labels,state,pid,start,upid,execs,log}. Every invocation
# is appended to $FAKE_DOCKER_STATE/calls (argv, space-separated) for the tests' assertions.
# Fault injection: a file DENY there makes every command fail like a client without access to
# the socket; a file DOWN, like a client whose daemon is not running.

set -u
LC_ALL=C
export LC_ALL
NL='
'
TAB=$(printf '\t')
STATE=${FAKE_DOCKER_STATE:-/run/fake-docker}
CDIR=$STATE/containers
SOCK=unix:///var/run/docker.sock

mkdir -p "$CDIR"
# One write per call: probes run in parallel, and three separate printfs to the same file
# interleaved ("dockerdocker exec ...") when two invocations appended at once.
CALL="docker$(printf ' %s' "$@")"
printf '%s\n' "$CALL" >>"$STATE/calls"

if [ -e "$STATE/DENY" ]; then
    printf '%s\n' "permission denied while trying to connect to the Docker daemon socket at $SOCK: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.47/containers/json\": dial unix /var/run/docker.sock: connect: permission denied" >&2
    exit 1
fi
if [ -e "$STATE/DOWN" ]; then
    printf '%s\n' "Cannot connect to the Docker daemon at $SOCK. Is the docker daemon running?" >&2
    exit 1
fi

unsupported() {
    printf 'docker: %s is not supported by the fleet test shim\n' "$1" >&2
    exit 1
}

daemon_error() {
    printf 'Error response from daemon: %s\n' "$1" >&2
    exit 1
}

usage_error() {
    printf 'docker: %s\n' "$1" >&2
    exit 125
}

# start_time PID: field 22 of /proc/PID/stat (empty if gone or a zombie).
start_time() {
    st_line=
    { IFS= read -r st_line <"/proc/$1/stat"; } 2>/dev/null
    case $st_line in *') '*) ;; *) return 1 ;; esac
    # shellcheck disable=SC2086  # numeric fields: word splitting wanted
    set -- ${st_line##*') '}
    case $1 in Z | X | x) return 1 ;; esac
    printf '%s\n' "${20}"
}

# alive PID START: the same process (pid and start time) still runs.
alive() {
    [ -n "$1" ] && [ "$(start_time "$1")" = "$2" ]
}

field() {
    cat "$C/$1" 2>/dev/null
}

# load: the container in directory C, its state brought up to date (an init that died means
# the container exited).
load() {
    ID=$(field id) NAME=$(field name) IMAGE=$(field image) STATUS=$(field state)
    PID=$(field pid) START=$(field start)
    if [ "$STATUS" = running ] && ! alive "$PID" "$START"; then
        STATUS=exited
        printf 'exited\n' >"$C/state"
    fi
}

# resolve REF: C = the directory of the container named REF, or whose id is or starts with REF.
resolve() {
    C=
    case $1 in '' | */* | .*) daemon_error "No such container: $1" ;; esac
    if [ -d "$CDIR/$1" ]; then
        C=$CDIR/$1
        return 0
    fi
    for rs_dir in "$CDIR"/*/; do
        [ -d "$rs_dir" ] || continue
        case $(cat "$rs_dir/id") in "$1"*)
            [ -z "$C" ] || daemon_error "multiple IDs found with provided prefix: $1"
            C=${rs_dir%/}
            ;;
        esac
    done
    [ -n "$C" ] || daemon_error "No such container: $1"
}

# ---------------------------------------------------------------- run

cmd_run() {
    detach='' name='' labels='' pidmode=''
    while [ "$#" -gt 0 ]; do
        case $1 in
        -d | --detach) detach=1 && shift ;;
        --name) name=$2 && shift 2 ;;
        --name=*) name=${1#--name=} && shift ;;
        -l | --label) labels="$labels$2$NL" && shift 2 ;;
        --label=*) labels="$labels${1#--label=}$NL" && shift ;;
        --pid) pidmode=$2 && shift 2 ;;
        --pid=*) pidmode=${1#--pid=} && shift ;;
        --) shift && break ;;
        -*) unsupported "docker run $1" ;;
        *) break ;;
        esac
    done
    [ -n "$detach" ] || unsupported "docker run without -d"
    [ "$#" -ge 2 ] || usage_error "run needs IMAGE and a command (the shim has no images)"
    case $pidmode in '' | host) ;; *) unsupported "docker run --pid $pidmode" ;; esac
    image=$1
    shift
    id=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    [ -n "$name" ] || name=shim_$(printf '%.8s' "$id")
    case $name in
    [a-zA-Z0-9]*) ;;
    *) usage_error "Invalid container name ($name), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed" ;;
    esac
    case $name in *[!a-zA-Z0-9_.-]*) usage_error "Invalid container name ($name), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed" ;; esac
    C=$CDIR/$name
    mkdir "$C" 2>/dev/null ||
        daemon_error "Conflict. The container name \"/$name\" is already in use by container \"$(cat "$C/id")\". You have to remove (or rename) that container to be able to reuse that name."
    printf '%s\n' "$id" >"$C/id"
    printf '%s\n' "$name" >"$C/name"
    printf '%s\n' "$image" >"$C/image"
    printf '%s' "$labels" >"$C/labels"
    printf '%s\n' "$pidmode" >"$C/pidmode"
    : >"$C/execs"
    if [ "$pidmode" = host ]; then
        set -- unshare --mount --propagation private sh -c 'exec "$@"' "$name" "$@"
    else
        set -- unshare --pid --fork --kill-child --mount-proc --propagation private \
            sh -c 'exec "$@"' "$name" "$@"
    fi
    # A background job of a non-interactive shell is no process group leader, so setsid execs
    # in place and $! is unshare itself. The container leaves our session and process group: a
    # deadline that kills the caller's group must not take the container down.
    setsid "$@" </dev/null >"$C/log" 2>&1 &
    upid=$!
    printf '%s\n' "$upid" >"$C/upid"
    # The container's init: unshare's child (its pid 1) or, with --pid host, unshare itself,
    # once it has exec'd (so /proc is remounted before anyone nsenters its mount namespace).
    init='' tries=0
    while [ "$tries" -lt 100 ]; do
        if [ "$pidmode" = host ]; then
            init=$upid
        else
            init=$(pgrep -P "$upid" | head -n 1)
        fi
        if [ -n "$init" ]; then
            cmd=$(tr '\000' ' ' <"/proc/$init/cmdline" 2>/dev/null)
            case $cmd in '' | unshare*) ;; *) break ;; esac
        fi
        kill -0 "$upid" 2>/dev/null || break
        sleep 0.05
        tries=$((tries + 1))
    done
    start=''
    [ -z "$init" ] || start=$(start_time "$init")
    printf '%s\n' "$init" >"$C/pid"
    printf '%s\n' "$start" >"$C/start"
    if [ -n "$start" ]; then
        printf 'running\n' >"$C/state"
    else
        printf 'exited\n' >"$C/state" # its command ended at once (or could not start: see log)
    fi
    printf '%s\n' "$id"
}

# ---------------------------------------------------------------- ps

# render TEMPLATE: the template with the fields of the loaded container substituted.
render() {
    rd_rest=$1 rd_out=''
    while :; do
        case $rd_rest in
        *'{{'*'}}'*) ;;
        *)
            literal "$rd_rest"
            rd_out=$rd_out$LIT
            break
            ;;
        esac
        literal "${rd_rest%%'{{'*}"
        rd_out=$rd_out$LIT
        rd_rest=${rd_rest#*'{{'}
        rd_field=${rd_rest%%'}}'*}
        rd_rest=${rd_rest#*'}}'}
        rd_field=$(printf '%s' "$rd_field" | tr -d ' ')
        case $rd_field in
        .ID) if [ -n "$NOTRUNC" ]; then rd_val=$ID; else rd_val=$(printf '%.12s' "$ID"); fi ;;
        .Names) rd_val=$NAME ;;
        .Image) rd_val=$IMAGE ;;
        .State) rd_val=$STATUS ;;
        .Labels) rd_val=$(paste -s -d, "$C/labels") ;;
        *) unsupported "the template field {{$rd_field}}" ;;
        esac
        rd_out=$rd_out$rd_val
    done
    printf '%s\n' "$rd_out"
}

# literal TEXT: LIT = TEXT with the two-character sequences \t and \n made a tab and a newline.
literal() {
    LIT='' lt_rest=$1
    while :; do
        case $lt_rest in
        *\\[tn]*) ;;
        *) break ;;
        esac
        lt_head=${lt_rest%%\\[tn]*}
        lt_rest=${lt_rest#"$lt_head"}
        case $lt_rest in \\t*) LIT=$LIT$lt_head$TAB ;; *) LIT=$LIT$lt_head$NL ;; esac
        lt_rest=${lt_rest#??}
    done
    LIT=$LIT$lt_rest
}

# has_label K[=V]: the loaded container carries label K (with value V).
has_label() {
    case $1 in
    *=*) grep -qxF -e "$1" "$C/labels" ;;
    *) cut -d= -f1 "$C/labels" | grep -qxF -e "$1" ;;
    esac
}

cmd_ps() {
    ALL='' QUIET='' NOTRUNC='' FORMAT='' FILTERS=''
    while [ "$#" -gt 0 ]; do
        case $1 in
        -a | --all) ALL=1 ;;
        -q | --quiet) QUIET=1 ;;
        --no-trunc) NOTRUNC=1 ;;
        -aq | -qa) ALL=1 QUIET=1 ;;
        --format) FORMAT=$2 && shift ;;
        --format=*) FORMAT=${1#--format=} ;;
        -f | --filter) FILTERS="$FILTERS$2$NL" && shift ;;
        --filter=*) FILTERS="$FILTERS${1#--filter=}$NL" ;;
        *) unsupported "docker ps $1" ;;
        esac
        shift
    done
    [ -n "$QUIET$FORMAT" ] || unsupported "docker ps without --format or -q"
    while IFS= read -r ps_filter; do
        case $ps_filter in '' | label=?*) ;; *) unsupported "docker ps --filter $ps_filter" ;; esac
    done <<EOF
$FILTERS
EOF
    for ps_dir in "$CDIR"/*/; do
        [ -s "$ps_dir/state" ] || continue
        C=${ps_dir%/}
        load
        [ "$STATUS" = running ] || [ -n "$ALL" ] || continue
        ps_keep=1
        while IFS= read -r ps_filter; do
            [ -z "$ps_filter" ] || has_label "${ps_filter#label=}" || ps_keep=''
        done <<EOF
$FILTERS
EOF
        [ -n "$ps_keep" ] || continue
        if [ -n "$QUIET" ]; then
            FORMAT='{{.ID}}'
        fi
        render "$FORMAT"
    done
}

# ---------------------------------------------------------------- exec

cmd_exec() {
    interactive='' detach=''
    while [ "$#" -gt 0 ]; do
        case $1 in
        -i | --interactive) interactive=1 ;;
        -d | --detach) detach=1 ;;
        -id | -di) interactive=1 detach=1 ;;
        -u | --user)
            case $2 in 0 | root) ;; *) unsupported "docker exec --user $2" ;; esac
            shift
            ;;
        --user=0 | --user=root) ;;
        --) shift && break ;;
        -*) unsupported "docker exec $1" ;;
        *) break ;;
        esac
        shift
    done
    [ "$#" -ge 2 ] || usage_error "exec needs CONTAINER and a command"
    resolve "$1"
    shift
    load
    [ "$STATUS" = running ] || daemon_error "container $ID is not running"
    set -- nsenter --target "$PID" --pid --mount --wd=/ -- "$@"
    if [ -n "$detach" ]; then
        setsid "$@" </dev/null >/dev/null 2>&1 &
        printf '%s\n' "$!" >>"$C/execs"
        exit 0
    fi
    if [ -n "$interactive" ]; then
        exec "$@"
    fi
    exec "$@" </dev/null
}

# ---------------------------------------------------------------- stop

cmd_stop() {
    wait_s=10
    while [ "$#" -gt 0 ]; do
        case $1 in
        -t | --time | --timeout) wait_s=$2 && shift 2 ;;
        --time=* | --timeout=*) wait_s=${1#*=} && shift ;;
        -*) unsupported "docker stop $1" ;;
        *) break ;;
        esac
    done
    case $wait_s in '' | *[!0-9]*) usage_error "invalid stop timeout: $wait_s" ;; esac
    [ "$#" -ge 1 ] || usage_error "stop needs at least one container"
    st_rc=0
    for st_ref in "$@"; do
        if ! (resolve "$st_ref"); then
            st_rc=1
            continue
        fi
        resolve "$st_ref"
        load
        if [ "$STATUS" = running ]; then
            # As docker does: TERM to the init (ignored by an init without a handler), KILL when
            # the time is up; killing a PID namespace's init ends everything in it.
            kill -s TERM "$PID" 2>/dev/null
            st_polls=0
            while alive "$PID" "$START" && [ "$st_polls" -lt $((wait_s * 10)) ]; do
                sleep 0.1
                st_polls=$((st_polls + 1))
            done
            alive "$PID" "$START" && kill -s KILL "$PID" 2>/dev/null
            st_polls=0
            while alive "$PID" "$START" && [ "$st_polls" -lt 100 ]; do
                sleep 0.1
                st_polls=$((st_polls + 1))
            done
            if alive "$PID" "$START"; then
                printf 'Error response from daemon: cannot stop container: %s: tried to kill container, but did not receive an exit event\n' "$st_ref" >&2
                st_rc=1
                continue
            fi
            printf 'exited\n' >"$C/state"
            if [ "$(field pidmode)" = host ]; then
                # Docker kills the rest of such a container's cgroup; the shim knows only what
                # `docker exec -d` started (nsenter and its children).
                for st_exec in $(field execs); do
                    pkill -KILL -P "$st_exec" 2>/dev/null
                    kill -s KILL "$st_exec" 2>/dev/null
                done
            fi
        fi
        printf '%s\n' "$st_ref"
    done
    exit "$st_rc"
}

[ "$#" -gt 0 ] || usage_error "the fleet test shim needs a command (run, ps, exec, stop)"
command=$1
shift
case $command in
run) cmd_run "$@" ;;
ps) cmd_ps "$@" ;;
exec) cmd_exec "$@" ;;
stop) cmd_stop "$@" ;;
container)
    [ "$#" -gt 0 ] || unsupported "docker container"
    sub=$1
    shift
    case $sub in
    ls) cmd_ps "$@" ;;
    run | exec | stop) "cmd_$sub" "$@" ;;
    *) unsupported "docker container $sub" ;;
    esac
    ;;
*) unsupported "docker $command" ;;
esac
