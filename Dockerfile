# The admission proxy, training and load tools in one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY admission admission
COPY proxy proxy
COPY training training
COPY workloads workloads
COPY lab lab
COPY cli cli
# a C compiler for the install only (the two C modules), removed in the same layer
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir ".[all,load]" \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
ENV ADMISSION_DATA=/data
EXPOSE 6432 6433
# Beyond loopback the server needs TLS and a password (ADMISSION_TLS_CERT, ADMISSION_TLS_KEY,
# ADMISSION_PASSWORD or ADMISSION_USERS) or, for a trial on your own machine,
# ADMISSION_INSECURE=true with the port published on loopback (-p 127.0.0.1:6432:6432).
CMD ["admission", "serve", "--listen", "0.0.0.0:6432", "--tpch", "0.1"]
