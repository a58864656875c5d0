# Metrale from its wheel: `docker build -t metrale .` then `docker run -p 8000:8000 -v metrale:/data metrale`.
# The first stage builds the wheel from this checkout; the second installs it with pip and serves it with the
# `metrale` command. The kernels compile for the machine the container runs on, at first start, into
# $METRALE_HOME/kernels (so gcc stays in the image); models, the database and static files live in /data too.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir "setuptools>=68" && pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# torch's CPU build first (PyPI's default build carries the CUDA libraries), then the wheel and the rest.
RUN pip install --no-cache-dir "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-cache-dir /tmp/dist/metrale-*.whl && rm -rf /tmp/dist
ENV METRALE_HOME=/data
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["metrale"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
