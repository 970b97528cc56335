-- One 64-float row for the example MLP, as v2 JSON:
--   wrk -t1 -c64 -d8s -s benchmarks/wrk/mlp_json.lua http://127.0.0.1:8000/v2/models/mlp/infer
wrk.method = "POST"
wrk.body = "{\"inputs\": [{\"name\": \"input\", \"datatype\": \"FP32\", \"shape\": [1, 64], \"data\": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]}]}"
wrk.headers["Content-Type"] = "application/json"
