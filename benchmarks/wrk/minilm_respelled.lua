-- One sentence for the `minilm` example, as v2 JSON, in four spellings that differ only in
-- case and spacing, in turn: with the example's cache_text_normalize (strip,space,lower) all
-- four are one cache entry, so every request after the first is a hit.
--   wrk -t1 -c64 -d8s -s benchmarks/wrk/minilm_respelled.lua http://127.0.0.1:8000/v2/models/minilm/infer
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local spellings = {
  "The parcel was shipped to the warehouse on a cold morning.",
  "the PARCEL was shipped to the warehouse on a cold morning.",
  "  The parcel   was shipped to the Warehouse on a cold morning.  ",
  "THE PARCEL WAS SHIPPED TO THE WAREHOUSE ON A COLD MORNING.",
}
local bodies = {}
for i, text in ipairs(spellings) do
  bodies[i] = "{\"inputs\": [{\"name\": \"text\", \"datatype\": \"BYTES\", \"shape\": [1, 1], "
    .. "\"data\": [\"" .. text .. "\"]}]}"
end
local counter = 0

function request()
  counter = counter + 1
  return wrk.format(nil, nil, nil, bodies[counter % #bodies + 1])
end
