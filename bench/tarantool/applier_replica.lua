-- The replica of the applier benchmark (bench/applier.py). First start: joins the master
-- and serves the control socket. Later starts (BENCH_TARGET_LSN set): a fiber created
-- before box.cfg polls the vclock every millisecond and, once component 1 (the master)
-- reaches the target, writes clock.monotonic() to BENCH_DONE_FILE. CLOCK_MONOTONIC is
-- the clock Python's time.monotonic() reads, so the bench subtracts its own start time.
-- Environment: BENCH_DIR, BENCH_LISTEN, BENCH_MASTER, BENCH_CTL, BENCH_MEMTX_MB,
-- BENCH_TARGET_LSN, BENCH_DONE_FILE.
package.path = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. '?.lua;' .. package.path
local ctl = require('ctl')
local fiber = require('fiber')
local clock = require('clock')

local target = tonumber(ctl.env('BENCH_TARGET_LSN', '0'))
if target > 0 then
    fiber.create(function()
        while true do
            local ok, lsn = pcall(function() return box.info.vclock[1] end)
            if ok and lsn ~= nil and lsn >= target then
                break
            end
            fiber.sleep(0.001)
        end
        local now = clock.monotonic()
        local f = io.open(ctl.env('BENCH_DONE_FILE') .. '.tmp', 'w')
        f:write(string.format('%.6f\n', now))
        f:close()
        os.rename(ctl.env('BENCH_DONE_FILE') .. '.tmp', ctl.env('BENCH_DONE_FILE'))
    end)
end

box.cfg{
    listen = ctl.env('BENCH_LISTEN'),
    work_dir = ctl.env('BENCH_DIR'),
    replication = {ctl.env('BENCH_MASTER')},
    wal_mode = 'write',
    memtx_memory = tonumber(ctl.env('BENCH_MEMTX_MB', '1024')) * 1024 * 1024,
    checkpoint_interval = 0,
    read_only = true,
    -- box.cfg returns at once rather than waiting to be in sync; the fiber above watches.
    replication_sync_timeout = 0.001,
    log_level = 4,
}

ctl.serve(ctl.env('BENCH_CTL'), {
    info = function()
        local up = box.info.replication[1] and box.info.replication[1].upstream
        return {id = box.info.id, uuid = box.info.uuid, vclock = ctl.vclock(),
                status = box.info.status, upstream = up and up.status or ''}
    end,
})
