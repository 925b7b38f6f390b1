# The product image. One image, two roles picked by the command:
#   process (default) | activities MODULE   (and the operator commands: check, topics, audit)
# It holds the product alone: the LLM simulator of docker-compose.yml's `sim` profile is the
# team's bench (packages/bench), built by deploy/sim.Dockerfile.
# Built from this repository; no registry host is named so any mirror can serve the base.

# Build stage: turn the source into a wheel, so the runtime image holds no build tree.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY stream ./stream
# shipped inside the wheel as instanced_stream.examples (the default spec, the demo's examples)
COPY examples ./examples
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
# Logs reach `docker logs` / kubectl at once; no .pyc writes, so the root
# filesystem can be mounted read-only in Kubernetes.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, read from pyproject.toml, in their own layer: editing the
# source then rebuilds in seconds instead of reinstalling aiokafka, sklearn, openai...
# Their versions are constraints.txt's (`./dev lock`), the ones CI tested.
COPY pyproject.toml constraints.txt /tmp/
RUN python -c "import subprocess, sys, tomllib; \
project = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
deps = project['dependencies'] + project['optional-dependencies']['registry']; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', \
'-c', '/tmp/constraints.txt', *deps])" \
    && rm /tmp/pyproject.toml /tmp/constraints.txt

COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels

# Numeric ids, so Kubernetes' runAsNonRoot can verify the user without a passwd lookup.
RUN groupadd --system --gid 10001 stream \
    && useradd --system --uid 10001 --gid stream --home-dir /var/lib/stream \
       --shell /usr/sbin/nologin stream \
    && mkdir -p /var/lib/stream \
    && chown stream:stream /var/lib/stream

WORKDIR /app
# The example spec and activity module: the compose file and the default
# STREAM_SPEC use them; a deployment mounts its own spec over STREAM_SPEC.
COPY examples ./examples

USER 10001:10001
ENV STREAM_DATA_DIR=/var/lib/stream \
    STREAM_SPEC=/app/examples/moderation/agent.yaml
# 6066: the processor's /metrics, /healthz, /readyz.
EXPOSE 6066
ENTRYPOINT ["stream"]
CMD ["process"]
