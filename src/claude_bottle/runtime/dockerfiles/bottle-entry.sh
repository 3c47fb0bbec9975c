#!/bin/bash
# The bottle's entrypoint, run (under tini, PID 1) as the bottle's user before anything of the agent's. The
# host starts a bottle while its gate still boots; this holds the command until the host creates
# $CLAUDE_BOTTLE_READY_FILE, which it does once the gate listens and the gate's CA is in the bottle's trust
# store. Before that it writes Claude Code's ~/.claude.json from $CLAUDE_BOTTLE_CLAUDE_JSON: the home directory
# is this container's own, so the file is fresh every run, whatever an earlier run's agent left in its state
# volume. Then, given the gate's address ($CLAUDE_BOTTLE_GATE), it watches the gate (watch_gate). Without the
# variables (the image run by hand) it runs the command at once.
set -eu

# The gate unreachable for this long ends the command, and with it the bottle (tini exits with its child).
# Longer than the gate's drain (10 s), during which it refuses new connections: a gate that stops while its
# host lives has its stream end first, so the host tells the run's end ("the gate stopped while the run went on").
GATE_GONE_SECONDS=15

# A bottle whose gate is gone has no peer left and nothing to wait for; when the host is gone too (its CLI and
# reaper killed), nothing else would end it. So every few seconds a connection is made to the gate's API port
# and closed at once, nothing sent (the gate neither answers nor audits it). None made for GATE_GONE_SECONDS
# (refused, or no answer within 3 s: the SYN to a gate killed outright is retried for minutes, measured)
# ends the command: SIGTERM, SIGKILL 5 s later. A probe that could not be started (the bottle's process limit
# reached) says nothing either way. Only against faults: the agent, the same user, may kill this loop and keep
# a bottle that reaches nothing; `claude-bottle ls` lists it and `stop` removes it.
watch_gate() {
    local host=${1%:*} port=${1##*:} target=$2 made=$SECONDS
    set +e
    while [ $((SECONDS - made)) -lt "$GATE_GONE_SECONDS" ]; do
        kill -0 "$target" 2>/dev/null || return 0  # the command ended by itself
        timeout 3 bash -c ': <>"/dev/tcp/$0/$1"' "$host" "$port"
        case $? in
            1 | 124) ;;  # refused, no route, or no answer
            *) made=$SECONDS ;;
        esac
        sleep 2
    done 2>/dev/null
    echo "claude-bottle: the gate is gone (unreachable for ${GATE_GONE_SECONDS} s): ending the bottle" >&2
    kill -TERM "$target" 2>/dev/null
    for _ in 1 2 3 4 5; do
        sleep 1
        kill -0 "$target" 2>/dev/null || return 0
    done
    kill -KILL "$target" 2>/dev/null
}

if [ -n "${CLAUDE_BOTTLE_CLAUDE_JSON:-}" ]; then
    (umask 077 && printf '%s' "$CLAUDE_BOTTLE_CLAUDE_JSON" > "$HOME/.claude.json")
fi
unset CLAUDE_BOTTLE_CLAUDE_JSON
if [ -n "${CLAUDE_BOTTLE_READY_FILE:-}" ]; then
    tries=0
    until [ -e "$CLAUDE_BOTTLE_READY_FILE" ]; do
        tries=$((tries + 1))
        if [ "$tries" -gt 3000 ]; then  # about 30 s
            echo "claude-bottle: the gate did not become ready within 30 s; see \`claude-bottle logs\`" >&2
            exit 125
        fi
        sleep 0.01
    done
fi
unset CLAUDE_BOTTLE_READY_FILE
if [ -n "${CLAUDE_BOTTLE_GATE:-}" ]; then
    watch_gate "$CLAUDE_BOTTLE_GATE" "$$" </dev/null >/dev/null &
fi
unset CLAUDE_BOTTLE_GATE
exec "$@"
