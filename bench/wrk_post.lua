-- wrk script: a small non-streaming chat completion, the same body bench/loadgen_raw.py sends.
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.body = '{"model": "bench-model", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16, "stream": false}'
