-- A control socket for the benchmarks: one JSON request per line in, one JSON reply per
-- line out, on a unix socket. The Python side (bench/procs.py, TarantoolNode) drives an
-- instance through it instead of parsing the YAML console. A command that fails answers
-- {"error": "..."}; the connection stays usable.
local socket = require('socket')
local json = require('json')

local M = {}

function M.serve(path, commands)
    os.remove(path)
    local server = socket.tcp_server('unix/', path, function(s)
        while true do
            local line = s:read('\n')
            if line == nil or line == '' then
                break
            end
            local ok, req = pcall(json.decode, line)
            local reply
            if not ok or type(req) ~= 'table' then
                reply = {error = 'bad request: ' .. tostring(req)}
            elseif commands[req.cmd] == nil then
                reply = {error = 'unknown command ' .. tostring(req.cmd)}
            else
                local ok2, res = pcall(commands[req.cmd], req)
                if ok2 then
                    reply = {ok = res == nil and json.NULL or res}
                else
                    reply = {error = tostring(res)}
                end
            end
            if not s:write(json.encode(reply) .. '\n') then
                break
            end
        end
    end)
    assert(server, 'cannot listen on ' .. path)
    return server
end

-- A vclock as {"1": lsn, ...}: JSON objects need string keys, and Lua arrays with holes
-- (a vclock without component 1) would encode wrongly.
function M.vclock()
    local out = {}
    for id, lsn in pairs(box.info.vclock) do
        out[tostring(id)] = lsn
    end
    return out
end

-- An environment variable, or default when unset or empty.
function M.env(name, default)
    local v = os.getenv(name)
    if v == nil or v == '' then
        return default
    end
    return v
end

return M
