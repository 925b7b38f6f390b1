# The LLM simulator's image, for docker-compose.yml's `sim` profile: the product and the
# team's bench (packages/bench), where the simulator lives. Not a model: it answers by a
# small trained classifier and rules (README, "The LLM simulator"). Built from the
# repository's root: docker build -f deploy/sim.Dockerfile .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY stream ./stream
COPY examples ./examples
COPY packages/bench ./packages/bench
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . ./packages/bench

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The versions CI tested (constraints.txt, `./dev lock`).
COPY constraints.txt /tmp/
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir -c /tmp/constraints.txt /wheels/*.whl \
    && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["stream"]
CMD ["llm-sim", "--host", "0.0.0.0", "--port", "8000"]
