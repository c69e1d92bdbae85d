# convo-mirror daemon image. Build: docker compose build (or docker build -t convo-mirror .)
# Two stages: the build stage has the C++ toolchain better-sqlite3 may need and the dev
# dependencies (TypeScript); the runtime stage has only dist/ and the production node_modules.

FROM node:20-bookworm-slim AS build
WORKDIR /app
# better-sqlite3 compiles from source when no prebuilt binary can be fetched.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build && npm prune --omit=dev --no-audit --no-fund

FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
# Code and dependencies stay root-owned (read-only to the daemon); only data/ belongs to `node`.
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
# The compose file mounts a named volume here; a new volume takes this directory's owner.
RUN mkdir -p /app/data/exports && chown -R node:node /app/data
USER node
ENV CONVO_MIRROR_DB=/app/data/mirror.sqlite \
    CONVO_MIRROR_EXPORT_DIR=/app/data/exports \
    CONVO_MIRROR_HTTP_HOST=0.0.0.0 \
    CONVO_MIRROR_HTTP_PORT=9464
# /healthz, /readyz, /metrics
EXPOSE 9464
CMD ["node", "--optimize-for-size", "dist/src/cli/index.js", "daemon"]
