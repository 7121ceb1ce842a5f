"""Providers' own batch jobs: the runner (`runner`), the contract a provider fills in (`contract`), the OpenAI
batch format they share (`openai_format`), each provider's jobs (`*_jobs`) and the Gemini translation."""
