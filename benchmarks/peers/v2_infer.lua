-- wrk script: POST one KServe v2 JSON inference request (one FP32 row of 64) per call.
--   wrk -t2 -c8 -d5s -s benchmarks/peers/v2_infer.lua http://127.0.0.1:PORT/v2/models/MODEL/infer
-- The input tensor is "INPUT" for the tiny model and "input" for mlp, chosen from the URL path;
-- set V2_INPUT to override it. Non-200 replies are counted by wrk ("Non-2xx or 3xx responses").
local function body_for(path)
  local name = os.getenv("V2_INPUT")
  if name == nil or name == "" then
    if string.find(path, "/models/mlp/", 1, true) then name = "input" else name = "INPUT" end
  end
  local data = {}
  for i = 0, 63 do data[#data + 1] = string.format("%.4f", (i - 32) / 16) end
  return '{"inputs":[{"name":"' .. name .. '","shape":[1,64],"datatype":"FP32","data":['
    .. table.concat(data, ",") .. ']}]}'
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  wrk.body = body_for(wrk.path)
end
