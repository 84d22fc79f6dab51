"""Is a compiled model's host cost higher when another compiled clone of it (same code objects) ran before?"""
import sys, torch
sys.path.insert(0, ".")
from autokernel.harness import timing
from autokernel.models import load_model, example_inputs
from autokernel.ops import swap
cfg = sys.argv[1]; shape = tuple(int(s) for s in sys.argv[2].split(","))
model = load_model("AutoModelForCausalLM", module="transformers", config=cfg, device="cuda", dtype=torch.float16)
sets = [example_inputs(model, shape, "cuda", torch.float16, seed=1000 + i) for i in range(2)]
def ms(fn):
    with torch.no_grad():
        return round(timing.time_fn(fn, sets, "cuda").median_us / 1e3, 3)
clone = lambda: swap.build(model, []).module()
print("A orig first:", ms(torch.compile(model)), "then clone:", ms(torch.compile(clone())), flush=True)
for n in range(3):  # prune-like trials
    torch._dynamo.reset(); ms(torch.compile(clone()))
print("B after 3 trials, no reset: orig", ms(torch.compile(model)), "clone", ms(torch.compile(clone())), flush=True)
torch._dynamo.reset()
print("C reset, clone alone:", ms(torch.compile(clone())), flush=True)
torch._dynamo.reset()
print("D reset, orig alone:", ms(torch.compile(model)), flush=True)
o = torch.compile(model); ms(o); c = torch.compile(clone()); ms(c)
print("E both compiled, again: orig", ms(o), "clone", ms(c), flush=True)
