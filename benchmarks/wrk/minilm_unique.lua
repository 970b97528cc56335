-- One sentence of 12 words for the `minilm` example, as v2 JSON, different in every request
-- (a count and a per-run number in it): every request is a cache miss and runs the model.
--   wrk -t1 -c64 -d8s -s benchmarks/wrk/minilm_unique.lua http://127.0.0.1:8000/v2/models/minilm/infer
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local counter = 0
local run = 0

function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000003)
  counter = math.random(1, 4000000)
  run = math.random(1, 1000000)
end

function request()
  counter = counter + 1
  local body = "{\"inputs\": [{\"name\": \"text\", \"datatype\": \"BYTES\", \"shape\": [1, 1], "
    .. "\"data\": [\"Order " .. counter .. " of batch " .. run
    .. " was shipped to the warehouse on a cold morning.\"]}]}"
  return wrk.format(nil, nil, nil, body)
end
