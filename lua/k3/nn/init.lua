-- k3.nn — model layers as plain Lua objects over k3 tensors: Linear, RMSNorm and the
-- SwiGLU MLP. Layers hold weights and a linear method; every number is computed by the C
-- ops (k3.linear through a method, k3.rms_norm, k3.silu_mul), never in Lua.
local k3 = require "k3"

local nn = {}

-- Errors are placed at the first caller outside k3's own modules (k3.args), as the C ops
-- place theirs; constructors' options tables accept only their listed keys (A.options).
local A = require "k3.args"
local raise = A.raise

local function check_tensor(v, what, fn)
  if not k3.is_tensor(v) then
    raise(string.format("%s: %s must be a tensor (got %s)", fn, what, type(v)))
  elseif v:is_freed() then
    raise(string.format("%s: %s is a freed tensor", fn, what))
  end
end

-- A layer's vector parameter: a 1-D tensor of n elements (n nil: any length).
local function check_vector(v, what, fn, n)
  check_tensor(v, what, fn)
  if v:dim() ~= 1 or (n and v:size(1) ~= n) then
    local sz = v:size()
    raise(string.format("%s: %s must be 1-D%s (got shape [%s])", fn, what,
                        n and string.format(" [%d]", n) or "", table.concat(sz, ", ")))
  end
end

-- A method option: a k3 method (k3.method.default(), k3.method.low_latency(...)) or nil.
local function check_method(m, what, fn)
  if m ~= nil and not (type(m) == "userdata" and getmetatable(m) and getmetatable(m).__name == "k3.Method") then
    raise(string.format("%s: %s must be a k3 method (k3.method.default() or k3.method.low_latency(...)); got %s",
                        fn, what, type(m)))
  end
end

local check_plan_options = require "k3.plan_options"

-- The method a Linear gets when none is given: the low-latency method with the policy's
-- plan for this weight shape when one exists (it owns a default method for every call it
-- declines), else the default method. A layer's weight is loaded once and never rewritten
-- while the model runs, so the method is told the weights are static (the skinny kernel may
-- start streaming them before the previous kernel ends) and the weight's storage is marked
-- static (a later copy, fill or set into it raises, naming the layer). opts.epilogue =
-- "silu_mul": the layer is a SwiGLU gate_up called with that epilogue, so its plan is
-- k3.plan_for(w, {epilogue = "silu_mul"}) (measured for the fused call).
--   nn.default_method(w[, owner[, {epilogue = "silu_mul"}]]) -> method
function nn.default_method(w, owner, opts)
  local epilogue = check_plan_options(opts, "default_method", 3)
  if k3.plan_for then
    local plan = k3.plan_for(w, epilogue and {epilogue = epilogue} or nil)
    if plan then
      w:mark_static(owner or "k3.nn.Linear weight")
      return k3.method.low_latency(plan, {static_weights = true})
    end
  end
  return k3.method.default()
end

-- Linear: y[M,N] = x[M,K] w[N,K]^T (+ bias[N]).
--   nn.Linear(w, {bias = b, method = m});  lin(x) or lin(x, {prologue = "silu_mul"}) (x is
--   then [M, 2K], gate | up: y = silu_mul(x) w^T with silu_mul's bits, k3.linear's option), or
--   lin(x, {epilogue = "silu_mul"}) (w is then [2N, K], gate rows | up rows: the result is
--   silu_mul(x w^T) [M, N] with the bits of the two separate ops)
local Linear = {}
Linear.__index = Linear
Linear.__name = "k3.nn.Linear"
nn.Linear = setmetatable(Linear, {
  __call = function(_, w, opts)
    check_tensor(w, "weight", "Linear")
    if w:dim() ~= 2 then
      raise(string.format("Linear: weight must be 2-D [N, K] (got %d dims)", w:dim()))
    end
    opts = A.options(opts, "Linear", {"bias", "method"})
    check_method(opts.method, "method", "Linear")
    if opts.bias ~= nil then
      check_vector(opts.bias, "bias", "Linear", w:size(1))
      if opts.bias:dtype() ~= w:dtype() or opts.bias:device() ~= w:device() then
        raise(string.format("Linear: bias (%s on %s) must have the weight's dtype and device (%s on %s)",
                            opts.bias:dtype(), opts.bias:device(), w:dtype(), w:device()))
      end
    end
    local self = setmetatable({weight = w, bias = opts.bias}, Linear)
    self.method = opts.method or nn.default_method(w)
    return self
  end,
})

-- The call's arguments are checked here, so their errors name the layer and its own argument
-- numbers (x #1, opts #2) rather than the method's.
function Linear:__call(x, opts)
  A.tensor(x, 1, "Linear")
  return self.method:apply(x, self.weight, self.bias, A.linear_options(opts, "Linear"))
end
function Linear:out_features() return self.weight:size(1) end
function Linear:in_features() return self.weight:size(2) end

-- The weight shape as the policy keys it ("NxK").
function Linear:shape_key()
  return string.format("%dx%d", self.weight:size(1), self.weight:size(2))
end

-- A copy with weights converted (t:to) to `dtype` on `device`; the method is rebuilt for
-- the new weight (an f64 weight gets the default method: no plan covers it).
-- opts (SwiGLU:to's): the default_method options of the call the layer serves.
function Linear:to(dtype, device, opts)
  local w = self.weight:to(device or self.weight:device()):to(dtype)
  local b = self.bias and self.bias:to(device or self.bias:device()):to(dtype)
  return nn.Linear(w, {bias = b, method = opts and nn.default_method(w, nil, opts)})
end

function Linear:free()
  self.weight:free()
  if self.bias then self.bias:free() end
end

function Linear:__tostring()
  if self.weight:is_freed() then return "Linear(freed)" end
  return string.format("Linear(%d -> %d, %s%s)", self:in_features(), self:out_features(),
                       self.weight:dtype(), self.bias and ", bias" or "")
end

-- RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * w.
local RMSNorm = {}
RMSNorm.__index = RMSNorm
RMSNorm.__name = "k3.nn.RMSNorm"
nn.RMSNorm = setmetatable(RMSNorm, {
  __call = function(_, w, eps)
    check_vector(w, "weight", "RMSNorm")
    if eps ~= nil and not (type(eps) == "number" and eps >= 0 and eps < math.huge) then
      raise(string.format("RMSNorm: eps must be a finite number >= 0 (got %s)", tostring(eps)))
    end
    return setmetatable({weight = w, eps = eps or 1e-5}, RMSNorm)
  end,
})

-- norm(x[, {out =, kernel =}]): k3.rms_norm's options.
function RMSNorm:__call(x, opts) return k3.rms_norm(x, self.weight, self.eps, opts) end

function RMSNorm:to(dtype, device)
  return nn.RMSNorm(self.weight:to(device or self.weight:device()):to(dtype), self.eps)
end

function RMSNorm:free() self.weight:free() end

function RMSNorm:__tostring()
  if self.weight:is_freed() then return "RMSNorm(freed)" end
  return string.format("RMSNorm(%d, eps=%g, %s)", self.weight:size(1), self.eps,
                       self.weight:dtype())
end

-- SwiGLU MLP: down(silu(gate) * up), gate and up from one fused gate_up projection
-- (the first I output features are the gate, the next I the up projection). The gate is the
-- gate_up projection's silu_mul epilogue (k3.linear's {epilogue = "silu_mul"}: gate_up writes
-- h [M, I] itself, the same bits as the projection then k3.silu_mul; on the skinny kernel's
-- classic path one kernel and the [M, 2I] round trip fewer), and down runs plainly on h;
-- fused = false runs gate_up, k3.silu_mul and down as three calls.
--   nn.SwiGLU(gate_up_w [2I, H], down_w [H, I], {gate_up_method =, down_method =, fused = true})
local SwiGLU = {}
SwiGLU.__index = SwiGLU
SwiGLU.__name = "k3.nn.SwiGLU"
nn.SwiGLU = setmetatable(SwiGLU, {
  __call = function(_, gate_up, down, opts)
    opts = A.options(opts, "SwiGLU", {"gate_up_method", "down_method", "fused"})
    if opts.fused ~= nil and type(opts.fused) ~= "boolean" then
      raise(string.format("SwiGLU: fused must be a boolean (got %s)", type(opts.fused)))
    end
    for _, p in ipairs({{gate_up, "gate_up"}, {down, "down"}}) do
      if getmetatable(p[1]) ~= Linear and not k3.is_tensor(p[1]) then
        raise(string.format("SwiGLU: %s must be a tensor or a k3.nn.Linear (got %s)", p[2], type(p[1])))
      elseif k3.is_tensor(p[1]) and p[1]:is_freed() then
        raise(string.format("SwiGLU: %s is a freed tensor", p[2]))
      end
    end
    check_method(opts.gate_up_method, "gate_up_method", "SwiGLU")
    check_method(opts.down_method, "down_method", "SwiGLU")
    if getmetatable(gate_up) ~= Linear then
      -- fused (the default): every call carries the silu_mul epilogue, so the plan is the one
      -- measured for that call
      local method = opts.gate_up_method
      if method == nil and opts.fused ~= false and k3.is_tensor(gate_up) then
        method = nn.default_method(gate_up, nil, {epilogue = "silu_mul"})
      end
      gate_up = nn.Linear(gate_up, {method = method})
    end
    if getmetatable(down) ~= Linear then down = nn.Linear(down, {method = opts.down_method}) end
    local two_i, i = gate_up:out_features(), down:in_features()
    if two_i ~= 2 * i then
      raise(string.format("SwiGLU: gate_up has %d output features, expected 2 * down's %d input features = %d",
                          two_i, i, 2 * i))
    end
    if gate_up:in_features() ~= down:out_features() then
      raise(string.format("SwiGLU: gate_up takes %d features but down returns %d",
                          gate_up:in_features(), down:out_features()))
    end
    local gw, dw = gate_up.weight, down.weight
    if gw:dtype() ~= dw:dtype() or gw:device() ~= dw:device() then
      raise(string.format("SwiGLU: gate_up (%s on %s) and down (%s on %s) must share dtype and device",
                          gw:dtype(), gw:device(), dw:dtype(), dw:device()))
    end
    return setmetatable({gate_up = gate_up, down = down, fused = opts.fused ~= false}, SwiGLU)
  end,
})

-- Intermediates are freed as soon as they are consumed: a decode loop makes thousands of
-- them and the Lua collector does not see the memory they hold.
function SwiGLU:__call(x)
  if self.fused then
    local h = self.gate_up(x, {epilogue = "silu_mul"})
    local y = self.down(h)
    h:free()
    return y
  end
  local gu = self.gate_up(x)
  local g = k3.silu_mul(gu)
  gu:free()
  local y = self.down(g)
  g:free()
  return y
end

-- A copy with weights converted; fused, the new gate_up takes the plan of its fused call as
-- the constructor gives it.
function SwiGLU:to(dtype, device)
  local gate_up = self.gate_up:to(dtype, device, self.fused and {epilogue = "silu_mul"} or nil)
  return setmetatable({gate_up = gate_up, down = self.down:to(dtype, device), fused = self.fused},
                      SwiGLU)
end

function SwiGLU:free()
  self.gate_up:free()
  self.down:free()
end

function SwiGLU:__tostring()
  if self.gate_up.weight:is_freed() or self.down.weight:is_freed() then return "SwiGLU(freed)" end
  return string.format("SwiGLU(%d -> %d -> %d)", self.gate_up:in_features(),
                       self.down:in_features(), self.down:out_features())
end

return nn
