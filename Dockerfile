# One image for every process of mm chat-ops: the bot (`mm-bot serve`), the workers (`mm-bot worker`), the
# scheduler (`mm-bot beat`) and the migration job (`mm-bot migrate`). The Helm chart (charts/mm-chatops) picks
# the process by its arguments. tests/test_image.py checks this file against the repository, the CLI and the
# chart.
#
#   docker build -t mm-chatops .
#   docker run --rm -p 3000:3000 -e SLACK_BOT_TOKEN=… -e SLACK_SIGNING_SECRET=… mm-chatops
#   docker run --rm mm-chatops worker -- --concurrency 8
#
# The base is named by its short name only: a build that must pull through a mirror passes
# --build-arg PYTHON_IMAGE=<mirror>/python:3.11-slim-bookworm. Both stages use the same base, so the virtualenv
# built in the first one finds its interpreter (/usr/local/bin/python3.11) in the second.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a wheel of the project, installed with its dependencies into the virtualenv /opt/mm -------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

RUN python -m venv /opt/mm

WORKDIR /src
# What the wheel is built from, and nothing else: the metadata (setuptools reads the readme) and the packages
# that [tool.setuptools.packages.find] includes. tests/ and docs/ stay out (.dockerignore keeps them out of the
# context too).
COPY pyproject.toml README.md ./
COPY mm_core/ mm_core/
COPY chatops/ chatops/
COPY bot/ bot/
COPY workers/ workers/
COPY slackio/ slackio/
COPY commands/ commands/
COPY playground/ playground/
COPY mm_testkit/ mm_testkit/
COPY migrations/ migrations/

# The language servers that the lsp tool starts (chatops/example.yaml configures pylsp; jedi-language-server is
# the other one the project tests), with the same requirements as the dev extra that the LSP tests run against.
# They go into the same virtualenv: the lsp tool looks for a server on the PATH, then beside the Python that runs
# mm-bot, and the sandbox binds the server's installation (/opt/mm and its base Python under /usr) read-only.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/mm/bin/pip install /wheels/*.whl \
      "python-lsp-server[pyflakes]>=1.11" \
      "jedi-language-server>=0.41"

# --- runtime -------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

# What the worker runs besides Python (mm_core/tools/sandbox.py, sandbox_network.py, workers/git.py):
#   git              clones and pushes the threads' workspaces (HTTPS only; the worker's git refuses ssh)
#   bubblewrap       the sandbox of every bash command and language server (a worker refuses to start
#                    without it under `sandbox: auto`)
#   slirp4netns      a sandboxed command's network when bash.network is on ...
#   nftables         ... and its packet filter (nft, in /usr/sbin), which keeps it off the cluster's networks
#   ca-certificates  HTTPS to Slack, the model, the git hosts
#   tini             PID 1: reaps the orphans of git, bwrap and the language servers, and forwards SIGTERM so
#                    that Celery's warm shutdown lets a running turn finish
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      git \
      bubblewrap \
      slirp4netns \
      nftables \
      ca-certificates \
      tini \
 && rm -rf /var/lib/apt/lists/*

# The user that runs every process: uid/gid 10001, mm_core.tools.sandbox.SANDBOX_UID, which the chart's
# podSecurityContext also names (runAsUser, fsGroup). Its home is not a directory of the image: HOME is /tmp,
# writable under the chart's readOnlyRootFilesystem (an emptyDir there); git gets a private HOME of its
# own anyway (workers/git.py).
RUN groupadd --gid 10001 mm \
 && useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin mm \
 && mkdir -p /var/lib/mm/workspaces \
 && chown -R 10001:10001 /var/lib/mm \
 && ln -s /tmp /var/lib/mm/var

# Owned by root, read-only to mm: nothing the agent runs can rewrite the service's code.
COPY --from=build /opt/mm /opt/mm

# /opt/mm/bin first: mm-bot, pylsp and jedi-language-server. /usr/sbin is already there (nft).
ENV PATH=/opt/mm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MM_WORKSPACES=/var/lib/mm/workspaces

# The working directory: relative paths of the embedded defaults land here. ./var (the SQLite default of a
# single-container `mm-bot dev`, the scheduler's celerybeat-schedule) is a link to /tmp, so that those writes
# work under readOnlyRootFilesystem too; a deployment's state lives in PostgreSQL, not there.
WORKDIR /var/lib/mm

# The image is broken if these fail: the console script, its parser, and the language servers start.
RUN mm-bot --help > /dev/null \
 && pylsp --version > /dev/null \
 && jedi-language-server --version > /dev/null \
 && bwrap --version > /dev/null \
 && nft --version > /dev/null

# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

# 3000: the bot's HTTP server (POST /slack/events, GET /healthz; cli.DEFAULT_PORT, the chart's bot.port).
# 9100: a worker's Prometheus metrics, when MM_METRICS_PORT=9100 (and MM_METRICS_HOST=0.0.0.0) are set.
EXPOSE 3000 9100

# No HEALTHCHECK: the image runs four different processes, Kubernetes ignores it, and the chart's probes
# (GET /healthz, `mm-bot probe live|ready`) are the health checks.
#
# ENTRYPOINT runs mm-bot under tini, so `docker run IMAGE worker` works and PID 1 reaps and forwards signals.
# CMD is the bot in HTTP mode, listening on every interface of the container (mm-bot's own default, 127.0.0.1,
# is unreachable from outside it). In Kubernetes a container's `command` replaces the ENTRYPOINT (tini
# included) and `args` replace the CMD: a chart that gives only `args` keeps tini; one that sets
# `command: ["mm-bot"]` runs mm-bot as PID 1 without it (signals still work: Celery and the bot handle SIGTERM;
# orphans are then not reaped), and `command: ["tini", "--", "mm-bot"]` is the same as leaving it out.
ENTRYPOINT ["tini", "--", "mm-bot"]
CMD ["serve", "--host", "0.0.0.0"]
