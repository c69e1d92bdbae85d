/**
 * Loaded with `node --import` into a process the benchmark measures (bench/run.ts, `--hostile`;
 * bench/fleet-daemons.ts): when that process exits, writes its peak resident set size
 * (`process.resourceUsage().maxRSS`, in KiB, as a decimal integer) to the file named by
 * `CONVO_MIRROR_BENCH_RSS_FILE`, and its CPU time to that name plus `.cpu.json`
 * (`{"userUs","systemUs"}`, µs over the process' life). Does nothing when the variable is unset. A
 * process killed by a signal writes nothing.
 */
import fs from 'node:fs';

const file = process.env.CONVO_MIRROR_BENCH_RSS_FILE;
if (file) {
  process.on('exit', () => {
    const usage = process.resourceUsage();
    fs.writeFileSync(file, String(usage.maxRSS));
    fs.writeFileSync(`${file}.cpu.json`, JSON.stringify({ userUs: usage.userCPUTime, systemUs: usage.systemCPUTime }));
  });
}
