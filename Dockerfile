# The admission proxy, training and load tools in one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY admission admission
COPY proxy proxy
COPY training training
COPY workloads workloads
RUN pip install --no-cache-dir ".[load]"
ENV ADMISSION_DATA=/data
EXPOSE 6432 6433
CMD ["admission", "serve", "--listen", "0.0.0.0:6432", "--tpch", "0.1"]
