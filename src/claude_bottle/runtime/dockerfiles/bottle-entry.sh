#!/bin/sh
# The bottle's entrypoint, run as the bottle's user before anything of the agent's. The host starts a bottle
# while its gate still boots; this holds the command until the host creates $CLAUDE_BOTTLE_READY_FILE, which
# it does once the gate listens and the gate's CA is in the bottle's trust store. Before that it writes
# Claude Code's ~/.claude.json from $CLAUDE_BOTTLE_CLAUDE_JSON: the home directory is this container's own,
# so the file is fresh every run, whatever an earlier run's agent left in its state volume. Without the
# variables (the image run by hand) it runs the command at once.
set -eu
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
exec "$@"
