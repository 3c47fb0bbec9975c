# The bottle: Claude Code and the tools an agent uses, as user 1000. No Node at run time: Claude Code ships
# a native binary, taken from its npm package in a throwaway stage.
ARG BASE=debian:bookworm-slim
FROM ${BASE} AS claude-code
COPY ca/ /usr/local/share/ca-certificates/claude-bottle/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
 && update-ca-certificates
ARG CLAUDE_CODE_VERSION
RUN NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt npm install -g --prefix /opt/npm --no-audit --no-fund \
      "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" \
 && cp "$(find /opt/npm -type f -name claude -path '*/claude-code-linux-*' ! -path '*-musl/*')" /claude \
 && /claude --version
# The classic builder keeps this stage as an untagged image. Labelled last with this build's own id, so the
# build removes its stage and no other: a concurrent build may be copying from a stage of the same layers.
ARG BUILD_ID
LABEL claude-bottle.stage=${BUILD_ID}

FROM ${BASE}
# Like Debian's slim images: no docs, man pages or translations from the packages installed below.
RUN printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
      'path-exclude /usr/share/lintian/*' > /etc/dpkg/dpkg.cfg.d/01-claude-bottle-slim
COPY ca/ /usr/local/share/ca-certificates/claude-bottle/
ARG EXTRA_PACKAGES=""
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates git ripgrep curl bash less procps tini ${EXTRA_PACKAGES} \
 && update-ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
# The system bundle as built, where a run's file mount over the system bundle does not hide it: the host
# reads it once per image and gives each run's bottle that bundle plus its gate's CA.
RUN mkdir -p /usr/share/claude-bottle && cp /etc/ssl/certs/ca-certificates.crt /usr/share/claude-bottle/
COPY --from=claude-code /claude /usr/local/bin/claude
COPY bottle-entry.sh /usr/local/bin/claude-bottle-entry
# No setuid or setgid programs: no-new-privileges disarms them, and without them nothing rests on that alone.
RUN chmod 0755 /usr/local/bin/claude-bottle-entry \
 && useradd --uid 1000 --create-home --shell /bin/bash agent \
 && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
 && mkdir /home/agent/.claude && chown agent:agent /home/agent/.claude \
 && chmod 1777 /home/agent /home/agent/.claude
# 1777: the bottle runs as the invoking user's uid (so workspace files are theirs); a new state volume
# copies this directory's owner and mode.
USER agent
# Where a native install of Claude Code lives; without it Claude Code warns at every start.
RUN mkdir -p /home/agent/.local/bin && ln -s /usr/local/bin/claude /home/agent/.local/bin/claude
ENV PATH=/home/agent/.local/bin:/usr/local/bin:/usr/bin:/bin
WORKDIR /workspace
# tini as PID 1: Claude Code gets signals as on a host (a PID 1 ignores SIGINT without a handler of its own,
# so an interrupted `claude -p` would run on) and what its tools leave running is reaped.
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/claude-bottle-entry"]
CMD ["claude"]
