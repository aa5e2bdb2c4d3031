-- One member of the 3-node full mesh of the lag benchmark (bench/lag.py). All members
-- list all three URIs and start together; Tarantool elects the bootstrap leader.
-- Control commands:
--   setup            create space `lag` {unsigned key, unsigned sent_us, string payload}
--   arm              (on the others) an on_replace trigger on `lag` records, per row the
--                    applier applies, now - sent_us: the row's replication lag, measured on
--                    one machine's realtime clock, taken when the row is applied here
--                    (before this replica's WAL write, as in replog's figure)
--   load             write `rate` rows/s for `seconds` s as transactions of `txn_rows` rows,
--                    each txn stamped with the realtime clock just before it is written
--                    (before the master's WAL write); open loop: `fibers` fibers share a
--                    fixed schedule, so a slow WAL shows up as lag, not as a lower rate
--   lags             {n, p50_ms, p99_ms, max_ms, mean_ms} of the recorded lags
-- Environment: BENCH_DIR, BENCH_LISTEN, BENCH_CTL, BENCH_PEERS (comma-separated URIs),
-- BENCH_MEMTX_MB.
package.path = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. '?.lua;' .. package.path
local ctl = require('ctl')
local fiber = require('fiber')
local clock = require('clock')

local peers = {}
for uri in string.gmatch(ctl.env('BENCH_PEERS'), '[^,]+') do
    table.insert(peers, uri)
end

box.cfg{
    listen = ctl.env('BENCH_LISTEN'),
    work_dir = ctl.env('BENCH_DIR'),
    replication = peers,
    wal_mode = 'write',
    memtx_memory = tonumber(ctl.env('BENCH_MEMTX_MB', '512')) * 1024 * 1024,
    checkpoint_interval = 0,
    replication_connect_timeout = 30,
    log_level = 4,
}
box.schema.user.grant('guest', 'replication', nil, nil, {if_not_exists = true})

local function now_us()
    return math.floor(clock.realtime() * 1e6)
end

local lags = {}

local function setup()
    local s = box.schema.space.create('lag', {if_not_exists = true})
    s:create_index('pk', {type = 'tree', parts = {1, 'unsigned'}, if_not_exists = true})
    return {vclock = ctl.vclock()}
end

local function arm()
    assert(box.space.lag ~= nil, 'space lag has not arrived yet')
    lags = {}
    box.space.lag:on_replace(function(_, new)
        if new ~= nil and box.session.type() == 'applier' then
            lags[#lags + 1] = now_us() - tonumber(new[2])
        end
    end)
    return true
end

local function load(req)
    local rate, seconds, txn_rows, nfibers = req.rate, req.seconds, req.txn_rows, req.fibers or 32
    local first = req.first_key or 1
    local payload = string.rep('v', 100)
    local space = box.space.lag
    local ntxns = math.floor(rate * seconds / txn_rows)
    local interval = txn_rows / rate          -- seconds between two scheduled txns
    local t0 = clock.realtime() + 0.1
    local done = fiber.channel(nfibers)
    local late = 0
    for f = 0, nfibers - 1 do
        fiber.create(function()
            local ok, err = pcall(function()
                for i = f, ntxns - 1, nfibers do
                    local due = t0 + i * interval
                    local wait = due - clock.realtime()
                    if wait > 0 then
                        fiber.sleep(wait)
                    elseif wait < -0.01 then
                        late = late + 1
                    end
                    local k = first + i * txn_rows
                    if txn_rows == 1 then
                        space:replace{k, now_us(), payload}
                    else
                        box.begin()
                        local sent = now_us()
                        for j = 0, txn_rows - 1 do
                            space:replace{k + j, sent, payload}
                        end
                        box.commit()
                    end
                end
            end)
            done:put(ok and '' or tostring(err))
        end)
    end
    local errors = {}
    for _ = 1, nfibers do
        local e = done:get()
        if e ~= '' then
            table.insert(errors, e)
        end
    end
    assert(#errors == 0, table.concat(errors, '; '))
    return {seconds = clock.realtime() - t0, rows = ntxns * txn_rows, late_txns = late, vclock = ctl.vclock()}
end

local function summary()
    local n = #lags
    if n == 0 then
        return {n = 0}
    end
    local sorted = {}
    local sum = 0
    for i = 1, n do
        sorted[i] = lags[i]
        sum = sum + lags[i]
    end
    table.sort(sorted)
    local function pct(p)   -- nearest rank, as bench/common.py percentile()
        local k = math.max(1, math.min(n, math.ceil(p / 100 * n)))
        return tonumber(sorted[k]) / 1000
    end
    return {n = n, p50_ms = pct(50), p99_ms = pct(99), max_ms = tonumber(sorted[n]) / 1000,
            mean_ms = tonumber(sum) / n / 1000}
end

ctl.serve(ctl.env('BENCH_CTL'), {
    info = function()
        return {id = box.info.id, uuid = box.info.uuid, vclock = ctl.vclock(), status = box.info.status,
                has_space = box.space.lag ~= nil}
    end,
    setup = setup,
    arm = arm,
    load = load,
    lags = summary,
})
