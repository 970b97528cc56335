-- One 64-float row for the example MLP, as v2 JSON, different in every request: every
-- request is a cache miss. The first value counts up (integers below 2^24, exact in FP32),
-- the second is random per wrk run, so runs do not repeat each other's rows.
--   wrk -t1 -c64 -d8s -s benchmarks/wrk/mlp_json_unique.lua http://127.0.0.1:8000/v2/models/mlp/infer
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local rest = string.rep("0.5, ", 61) .. "0.5"
local counter = 0
local run = "0.5"

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000003)
  counter = math.random(1, 4000000)
  run = tostring(math.random(1, 1000000))
end

function request()
  counter = counter + 1
  local body = "{\"inputs\": [{\"name\": \"input\", \"datatype\": \"FP32\", \"shape\": [1, 64], \"data\": ["
    .. counter .. ", " .. run .. ", " .. rest .. "]}]}"
  return wrk.format(nil, nil, nil, body)
end
