-- The server of the client benchmark (bench/client_load.py): one space `bench` with a string
-- primary key (replog's keys are strings) holding {key, 100-byte string}; guest may read and
-- write it over net.box. Environment: BENCH_DIR (work dir), BENCH_LISTEN (port), BENCH_CTL
-- (control socket), BENCH_WAL_MODE (write|fsync), BENCH_MEMTX_MB.
package.path = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. '?.lua;' .. package.path
local ctl = require('ctl')

box.cfg{
    listen = ctl.env('BENCH_LISTEN'),
    work_dir = ctl.env('BENCH_DIR'),
    wal_mode = ctl.env('BENCH_WAL_MODE', 'write'),
    memtx_memory = tonumber(ctl.env('BENCH_MEMTX_MB', '2048')) * 1024 * 1024,
    checkpoint_interval = 0,          -- no snapshot in the middle of a run
    log_level = 4,
}

box.once('bench', function()
    box.schema.user.grant('guest', 'read,write,execute', 'universe')
    local s = box.schema.space.create('bench')
    s:create_index('pk', {type = 'tree', parts = {1, 'string'}})
end)

ctl.serve(ctl.env('BENCH_CTL'), {
    info = function() return {vclock = ctl.vclock(), count = box.space.bench:len()} end,
})
