-- The minilm benchmarks' fixed corpus (benchmarks/minilm_corpus.py, one sentence per line),
-- one sentence per request as v2 JSON (`text`, BYTES, shape [1, 1]), cycling through the file
-- in its order from the first line (each wrk thread from its own offset):
--   .venv/bin/python benchmarks/minilm_corpus.py -o /tmp/corpus.txt
--   MINILM_CORPUS=/tmp/corpus.txt wrk -t1 -c64 -d8s -s benchmarks/wrk/minilm_corpus.lua \
--     http://127.0.0.1:8000/v2/models/minilm/infer
-- The same bodies fit inferd's `minilm` ensemble and the peers' minilm service
-- (benchmarks/peers). benchmarks/minilm_peers.py drives it.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local bodies = {}
local next_body = 1
local threads = 0

local function escape(s)
  return (s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end))
end

function setup(thread)
  thread:set("offset", threads)
  threads = threads + 1
end

function init(args)
  local path = os.getenv("MINILM_CORPUS")
  if path == nil or path == "" then error("set MINILM_CORPUS to the corpus file") end
  local file = assert(io.open(path, "r"))
  for line in file:lines() do
    if line ~= "" then
      bodies[#bodies + 1] = '{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,1],'
        .. '"data":["' .. escape(line) .. '"]}]}'
    end
  end
  file:close()
  if #bodies == 0 then error("no sentences in " .. path) end
  -- threads start spread over the corpus (offset is 0 for the only thread of -t1)
  next_body = 1 + math.floor((offset or 0) * #bodies / 8) % #bodies
end

function request()
  local body = bodies[next_body]
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, body)
end
