"""The command line: `batchyard run | serve | worker` (`main`), the offline run and its report, the console,
and moving files in and out (`transfer`). The top layer: it composes the runtime and the HTTP app."""

from gateway.runtime.pool import declare_native_providers

# The top layer composes: every process that reads a config through the command line (`run`, `serve`, the
# `worker`s a supervisor starts, `config check`) has the native providers declared before it reads one; a
# validation process is handed the config already read.
declare_native_providers()
