-- The master of the applier benchmark (bench/applier.py): one space `bench` with an
-- unsigned primary key; guest may replicate. `load` writes the backlog the replica will
-- catch up: `rows` rows {key, 100-byte string} as transactions of `txn_rows` rows, from
-- `fibers` fibers at once so the WAL thread group-commits them (the shape of each
-- transaction is what the replica sees; how fast the load goes is not measured).
-- Environment: BENCH_DIR (work dir), BENCH_LISTEN (port), BENCH_CTL (control socket),
-- BENCH_MEMTX_MB.
package.path = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. '?.lua;' .. package.path
local ctl = require('ctl')
local fiber = require('fiber')
local clock = require('clock')

box.cfg{
    listen = ctl.env('BENCH_LISTEN'),
    work_dir = ctl.env('BENCH_DIR'),
    wal_mode = 'write',
    memtx_memory = tonumber(ctl.env('BENCH_MEMTX_MB', '1024')) * 1024 * 1024,
    checkpoint_interval = 0,          -- no snapshot in the middle of a run
    log_level = 4,
}

box.once('bench', function()
    box.schema.user.grant('guest', 'replication')
    local s = box.schema.space.create('bench')
    s:create_index('pk', {type = 'tree', parts = {1, 'unsigned'}})
end)

local function load(req)
    local rows, txn_rows, nfibers = req.rows, req.txn_rows, req.fibers or 64
    local first = req.first_key or 1
    local value = string.rep('v', 100)
    local space = box.space.bench
    local ntxns = math.floor(rows / txn_rows)
    local next_txn = 0
    local done = fiber.channel(nfibers)
    local t0 = clock.monotonic()
    for _ = 1, nfibers do
        fiber.create(function()
            local ok, err = pcall(function()
                while next_txn < ntxns do
                    local i = next_txn
                    next_txn = i + 1
                    local k = first + i * txn_rows
                    if txn_rows == 1 then
                        space:replace{k, value}
                    else
                        box.begin()
                        for j = 0, txn_rows - 1 do
                            space:replace{k + j, value}
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
    return {seconds = clock.monotonic() - t0, rows = ntxns * txn_rows, vclock = ctl.vclock()}
end

ctl.serve(ctl.env('BENCH_CTL'), {
    info = function() return {id = box.info.id, uuid = box.info.uuid, vclock = ctl.vclock()} end,
    load = load,
})
