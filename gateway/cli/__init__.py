"""The command line: `batchyard run | serve | worker` (`main`), the offline run and its report, the console,
and moving files in and out (`transfer`). The top layer: it composes the runtime and the HTTP app."""
