-- One load process of the client benchmark (bench/client_load.py): BENCH_WRITERS fibers on
-- one net.box connection to BENCH_TARGET, each doing `replace{key, 100-byte string}` with a
-- fresh key (BENCH_OP=put) or `get{key}` of a preloaded key g<0..BENCH_KEYS-1> (get) in a loop
-- for BENCH_SECONDS from BENCH_START_AT; (BENCH_OP=preload writes those keys once). Writes one JSON line
-- to the file BENCH_OUT (not stdout, which the event loop may have made non-blocking): ops, this
-- process's CPU seconds, wall seconds, and up to 20,000 latency samples in microseconds.
local fiber = require('fiber')
local clock = require('clock')
local json = require('json')
local netbox = require('net.box')

local function env(name, default)
    local v = os.getenv(name)
    if v == nil or v == '' then return default end
    return v
end

local target = env('BENCH_TARGET')
local writers = tonumber(env('BENCH_WRITERS', '1'))
local seconds = tonumber(env('BENCH_SECONDS', '5'))
local op = env('BENCH_OP', 'put')
local prefix = env('BENCH_PREFIX', 'p')
local nkeys = tonumber(env('BENCH_KEYS', '10000'))
local value = string.rep('v', 100)

local conn = netbox.connect(target, {wait_connected = true})
assert(conn:is_connected(), 'cannot connect to ' .. target)
local space = conn.space.bench

if op == 'preload' then
    for i = 0, nkeys - 1 do space:replace{'g' .. i, value} end
    local f = io.open(env('BENCH_OUT'), 'w')
    f:write(json.encode({ops = nkeys}) .. '\n')
    f:close()
    os.exit(0)
end

-- every load process of a phase starts at the same moment (BENCH_START_AT, epoch seconds)
local start_at = tonumber(env('BENCH_START_AT', '0'))
while clock.time() < start_at do fiber.sleep(0.001) end

local SAMPLES = 20000
local samples = {}
local nsamples = 0
local ops = 0
local cpu0, t0 = os.clock(), clock.monotonic()
local deadline = t0 + seconds
local done = fiber.channel(writers)
for w = 1, writers do
    fiber.create(function()
        local n = 0
        local rnd = math.random
        while clock.monotonic() < deadline do
            local s = clock.monotonic()
            if op == 'put' then
                space:replace{prefix .. '-' .. w .. '-' .. n, value}
            else
                space:get{'g' .. rnd(0, nkeys - 1)}
            end
            local lat = math.floor((clock.monotonic() - s) * 1e6 + 0.5)
            n = n + 1
            ops = ops + 1
            -- reservoir sampling: every latency has the same chance to be kept
            if nsamples < SAMPLES then
                nsamples = nsamples + 1
                samples[nsamples] = lat
            else
                local j = rnd(1, ops)
                if j <= SAMPLES then samples[j] = lat end
            end
        end
        done:put(n)
    end)
end
for _ = 1, writers do done:get() end
local f = io.open(env('BENCH_OUT'), 'w')
f:write(json.encode({ops = ops, cpu_s = os.clock() - cpu0, wall_s = clock.monotonic() - t0, lat_us = samples}) .. '\n')
f:close()
os.exit(0)
