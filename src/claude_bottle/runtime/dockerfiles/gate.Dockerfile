# The gate: this package on Debian's Python, run as an unprivileged user.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# Like Debian's slim images: no docs, man pages or translations from the packages installed below.
RUN printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
      'path-exclude /usr/share/lintian/*' > /etc/dpkg/dpkg.cfg.d/01-claude-bottle-slim
COPY ca/ /usr/local/share/ca-certificates/claude-bottle/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && update-ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY requirements.txt /opt/gate/requirements.txt
RUN python3 -m venv /opt/gate \
 && /opt/gate/bin/pip install --no-cache-dir --disable-pip-version-check \
      --cert /etc/ssl/certs/ca-certificates.crt -r /opt/gate/requirements.txt
# The package, with the license notices of what it uses that the wheels do not carry (gate/licenses/).
COPY claude_bottle/ /opt/gate/app/claude_bottle/
# Compiled now: the root file system is read-only at run time, and compiling at each start costs a gate start.
RUN /opt/gate/bin/python -m compileall -q /opt/gate/app
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin gate
USER gate
ENV PYTHONPATH=/opt/gate/app PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["/opt/gate/bin/python", "-m", "claude_bottle", "gate"]
