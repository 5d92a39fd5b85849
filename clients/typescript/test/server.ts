// A real `cairn serve` for the tests: the binary in `CAIRN_BIN`, else the
// one cargo built (`target/release/cairn`, then `target/debug/cairn`), on a
// free port, with a SQLite store and the tests' workflows in a temporary
// folder. As the Python client's tests start it, so both are held to the
// same server.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root: this file runs from `clients/typescript/build/test`. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export const WORKFLOWS: Record<string, string> = {
  gated: `
name: gated
nodes:
  - id: gate
    approval: "ship?"
  - id: after
    needs: [gate]
    value: { shipped: true }
output: "{{ nodes.after.output }}"
`,
  asks: `
name: asks
nodes:
  - id: q
    ask: "Which branch?"
    schema: { type: string }
  - id: echo
    needs: [q]
    value: { branch: "{{ nodes.q.output }}" }
`,
};

/** The cairn binary to test, or `undefined` when there is none to find. */
export function cairnBin(): string | undefined {
  const given = process.env["CAIRN_BIN"];
  if (given) return given;
  for (const profile of ["release", "debug"]) {
    const p = join(ROOT, "target", profile, "cairn");
    if (existsSync(p)) return p;
  }
  return undefined;
}

/** Why the server tests skip, or `false` when they run. */
export const skipServer: string | false = cairnBin()
  ? false
  : "no cairn binary: build it (cargo build) or set CAIRN_BIN";

async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const addr = s.address();
      s.close(() => (typeof addr === "object" && addr ? ok(addr.port) : fail(new Error("no port"))));
    });
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((ok) => setTimeout(ok, ms));
}

/**
 * One `cairn serve`, which a test may stop and start again on the same
 * port and store.
 */
export class Server {
  readonly url: string;
  private proc: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();

  private constructor(
    readonly dir: string,
    readonly port: number,
    private readonly token: string | undefined,
  ) {
    this.url = `http://127.0.0.1:${port}`;
  }

  /** A server in a new temporary folder, started; with `token`, it requires it. */
  static async start(token?: string): Promise<Server> {
    const dir = mkdtempSync(join(tmpdir(), "cairn-ts-client-"));
    mkdirSync(join(dir, "workflows"));
    for (const [name, text] of Object.entries(WORKFLOWS)) {
      writeFileSync(join(dir, "workflows", `${name}.yaml`), text);
    }
    const s = new Server(dir, await freePort(), token);
    await s.start();
    return s;
  }

  /** Starts the process and waits until `/healthz` answers. */
  async start(): Promise<void> {
    const bin = cairnBin();
    if (!bin) throw new Error("no cairn binary");
    const env = { ...process.env };
    for (const k of ["CAIRN_TOKEN", "CAIRN_STORE", "CAIRN_LOG_DIR"]) delete env[k];
    if (this.token) env["CAIRN_TOKEN"] = this.token;
    const err = openSync(join(this.dir, "serve.err"), "a");
    const proc = spawn(
      bin,
      [
        "--store",
        join(this.dir, "cairn.db"),
        "serve",
        "--addr",
        `127.0.0.1:${this.port}`,
        "--workflows",
        join(this.dir, "workflows"),
      ],
      { cwd: this.dir, env, stdio: ["ignore", "ignore", err] },
    );
    closeSync(err);
    this.proc = proc;
    let failed: Error | undefined;
    this.exited = new Promise((ok) => {
      proc.once("exit", () => ok());
      // A binary that cannot be run never exits: it fails to start.
      proc.once("error", (e) => {
        failed = e;
        ok();
      });
    });
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (failed) throw new Error(`cannot run ${bin}: ${failed.message}`);
      if (proc.exitCode !== null) break;
      try {
        const r = await fetch(`${this.url}/healthz`, { signal: AbortSignal.timeout(1000) });
        if (r.status === 200) return;
      } catch {
        // Not listening yet.
      }
      await sleep(50);
    }
    throw new Error(`cairn serve did not answer /healthz: ${this.log()}`);
  }

  /** SIGTERM, and waits for the process to end (30 s at most). */
  async stop(): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill("SIGTERM");
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((ok) => (timer = setTimeout(() => ok(true), 30_000)));
    const killed = await Promise.race([this.exited.then(() => false), late]);
    clearTimeout(timer);
    if (killed) {
      proc.kill("SIGKILL");
      await this.exited;
      throw new Error("cairn serve did not stop within 30 s of SIGTERM");
    }
  }

  /** What the server wrote to stderr. */
  log(): string {
    try {
      return readFileSync(join(this.dir, "serve.err"), "utf8");
    } catch {
      return "";
    }
  }

  /** Stops the server and removes its folder. */
  async close(): Promise<void> {
    try {
      await this.stop();
    } finally {
      rmSync(this.dir, { recursive: true, force: true });
    }
  }
}
