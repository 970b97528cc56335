-- wrk script for Mosec's own (non-v2) route: POST /inference with a JSON list of 64 floats
-- (one row); the reply is a JSON list of 16 floats (tiny) or {"probabilities":[16], "label":n} (mlp).
--   wrk -t2 -c8 -d5s -s benchmarks/peers/mosec_infer.lua http://127.0.0.1:PORT/inference
-- (mosec_server.py --api v2, the default, serves /v2/models/MODEL/infer instead: use v2_infer.lua.)
local data = {}
for i = 0, 63 do data[#data + 1] = string.format("%.4f", (i - 32) / 16) end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = "[" .. table.concat(data, ",") .. "]"
