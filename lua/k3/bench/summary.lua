-- k3.bench.summary — the machine-readable result file of a GPU's benchmark runs,
-- bench/summary-<gpu>.json (bench/summary-h200.json for the H200): one top-level object per
-- benchmark (`linear`, `attn_res`, `stack`), each with date (UTC, ISO 8601), machine, commit
-- and command beside its figures. A run rewrites only its own benchmark's objects; the rest
-- of the file is kept as it was.
local U = require "k3.bench.util"

local S = {}

-- S.gpu_tag(machine) -> "h200" for "NVIDIA H200, 132 SMs, ..."; the lower-case model name's
-- last word (letters and digits) otherwise; "gpu" when machine names none.
function S.gpu_tag(machine)
  local name = tostring(machine or ""):match("^([^,]+)") or ""
  local tag = name:lower():match("(h%d+)") or name:lower():match("([%w]+)%s*$")
  return tag and tag ~= "" and tag or "gpu"
end

-- S.commit(root) -> $K3_COMMIT, else `git rev-parse --short HEAD` in root, else "unknown"
-- (a copy of the tree without its .git).
function S.commit(root)
  local c = os.getenv("K3_COMMIT")
  if c and c ~= "" then return c end
  local p = io.popen("git -C " .. U.shell_quote(root) .. " rev-parse --short HEAD 2>/dev/null")
  local s = p and p:read("l")
  if p then p:close() end
  return s and s ~= "" and s or "unknown"
end

-- S.update(path, key, obj): sets the top-level `key` of the JSON object in `path` (created when
-- missing) to obj and writes the file back (keys sorted). Raises when the file exists but is
-- not a JSON object, rather than overwrite what it cannot read.
function S.update(path, key, obj)
  local doc = {}
  local f = io.open(path, "r")
  local text = f and f:read("a")
  if f then f:close() end
  if text then
    local ok, v = pcall(U.json_decode, text)
    if not ok or type(v) ~= "table" then
      error(string.format("bench: %s is not a JSON object (%s); not overwritten", path,
                          ok and type(v) or tostring(v)), 0)
    end
    doc = v
  end
  doc[key] = obj
  U.write_file(path, U.json_encode(doc) .. "\n")
end

return S
