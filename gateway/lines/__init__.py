"""The rules about one line (a request) that the pipeline and the backends both apply: which body fields a
line may carry (`body_fields`), which media URLs may be fetched for it (`media_urls`), whose budget it spends
and whether that is spent (`budget`), its input tokens and output bound before it runs (`tokens`), what a native
job's lines reserve of a budget (`reservation`), and why a batch's lines must stop (`stops`). Below the backends, so a
backend applies them without importing the pipeline that drives it."""
