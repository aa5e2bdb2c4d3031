-- wrk script of bench/client_load.py --http: PUT /v1/spaces/bench/keys/<fresh key> with a
-- 100-byte JSON string, keys unique per wrk thread (w<thread>-<n>).
local threads = 0
function setup(thread)
    thread:set("tid", threads)
    threads = threads + 1
end
function init(args)
    n = 0
    body = '"' .. string.rep("v", 98) .. '"'
    headers = {["Content-Type"] = "application/json"}
end
function request()
    n = n + 1
    return wrk.format("PUT", "/v1/spaces/bench/keys/w" .. tid .. "-" .. n, headers, body)
end
