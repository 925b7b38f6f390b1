# The product image: processor, activity worker and simulator share it.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream ./stream
COPY examples ./examples
RUN pip install --no-cache-dir . && useradd --uid 10001 stream
USER stream
ENV STREAM_DATA_DIR=/tmp/stream-data \
    STREAM_SPEC=/app/examples/moderation/agent.yaml
ENTRYPOINT ["stream"]
CMD ["process"]
