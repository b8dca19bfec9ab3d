"""What an LLM call needs, in one place: an answer's usage, the prices, the batch line formats.

- `usage`: an answer's JSON body parsed once (`answer_doc`, kept on its `Outcome`) and
  its `usage` as a typed `Usage`, in OpenAI's and Anthropic's shapes, streams included;
  what spend, pricing and a budget's settle read.
- `prices`: `Price` (validated here, and only here: `parse_price`), `PriceTable` and the
  arithmetic of a cost.
- `batch`: the OpenAI Batch and Anthropic Message Batches line formats, read as workload
  lines and written as their output lines.
"""
