"""The Batch APIs served by the gateway: OpenAI's Files and Batches, Anthropic's Message Batches."""
