#!/usr/bin/env python3
"""Write the benchmark nets of models/ that are regular enough to generate: NiN for CIFAR-10 and
a small GoogLeNet-style inception net. Re-run after editing; the prototxts are committed.

    python tools/gen_models.py
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def data_layers(source, mean, train_batch, test_batch, crop=None):
    crop_txt = f" crop_size: {crop}" if crop else ""
    out = []
    for phase, split, batch in (("TRAIN", "train", train_batch), ("TEST", "test", test_batch)):
        mirror = " mirror: true" if phase == "TRAIN" and crop else ""
        out.append(f'''layer {{
  name: "data"
  type: "Data"
  top: "data"
  top: "label"
  include {{ phase: {phase} }}
  transform_param {{ mean_file: "{mean}"{crop_txt}{mirror} }}
  data_param {{ source: "{source}_{split}_lmdb" batch_size: {batch} backend: LMDB }}
}}''')
    return out


def conv(name, bottom, num, k, pad=0, stride=1, std=0.05, filler=None, relu=True):
    filler = filler or f'type: "gaussian" std: {std}'
    text = [f'''layer {{
  name: "{name}"
  type: "Convolution"
  bottom: "{bottom}"
  top: "{name}"
  param {{ lr_mult: 1 decay_mult: 1 }}
  param {{ lr_mult: 2 decay_mult: 0 }}
  convolution_param {{
    num_output: {num} kernel_size: {k} pad: {pad} stride: {stride}
    weight_filler {{ {filler} }}
    bias_filler {{ type: "constant" value: 0 }}
  }}
}}''']
    if relu:
        text.append(f'layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}')
    return text


def pool(name, bottom, kind, k, stride, pad=0, global_=False):
    spec = "global_pooling: true" if global_ else f"kernel_size: {k} stride: {stride} pad: {pad}"
    return [f'''layer {{
  name: "{name}"
  type: "Pooling"
  bottom: "{bottom}"
  top: "{name}"
  pooling_param {{ pool: {kind} {spec} }}
}}''']


def tail(bottom, num_classes, ip=True):
    out = []
    if ip:
        out.append(f'''layer {{
  name: "classifier"
  type: "InnerProduct"
  bottom: "{bottom}"
  top: "classifier"
  param {{ lr_mult: 1 decay_mult: 1 }}
  param {{ lr_mult: 2 decay_mult: 0 }}
  inner_product_param {{
    num_output: {num_classes}
    weight_filler {{ type: "xavier" }}
    bias_filler {{ type: "constant" value: 0 }}
  }}
}}''')
        bottom = "classifier"
    out.append(f'''layer {{
  name: "accuracy"
  type: "Accuracy"
  bottom: "{bottom}"
  bottom: "label"
  top: "accuracy"
  include {{ phase: TEST }}
}}''')
    out.append(f'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "{bottom}" bottom: "label" top: "loss" }}')
    return out


def nin():
    L = data_layers("data/cifar10/cifar10", "data/cifar10/mean.binaryproto", 128, 100)
    L += conv("conv1", "data", 192, 5, pad=2) + conv("cccp1", "conv1", 160, 1) + conv("cccp2", "cccp1", 96, 1)
    L += pool("pool1", "cccp2", "MAX", 3, 2)
    L += ['layer { name: "drop1" type: "Dropout" bottom: "pool1" top: "pool1" dropout_param { dropout_ratio: 0.5 } }']
    L += conv("conv2", "pool1", 192, 5, pad=2) + conv("cccp3", "conv2", 192, 1) + conv("cccp4", "cccp3", 192, 1)
    L += pool("pool2", "cccp4", "AVE", 3, 2)
    L += ['layer { name: "drop2" type: "Dropout" bottom: "pool2" top: "pool2" dropout_param { dropout_ratio: 0.5 } }']
    L += conv("conv3", "pool2", 192, 3, pad=1) + conv("cccp5", "conv3", 192, 1) + conv("cccp6", "cccp5", 10, 1)
    L += pool("pool3", "cccp6", "AVE", 8, 1)
    L += tail("pool3", 10, ip=False)
    head = ("# Network-in-Network for CIFAR-10 (Lin et al. 2013; the model-zoo cifar10 NiN), written\n"
            "# by tools/gen_models.py. Input 3x32x32, batch 128.\n")
    return head + 'name: "NIN_CIFAR10"\n' + "\n".join(L) + "\n"


def inception(name, bottom, c1, c3r, c3, c5r, c5, pp):
    L = conv(f"{name}_1x1", bottom, c1, 1, filler='type: "xavier"')
    L += conv(f"{name}_3x3_reduce", bottom, c3r, 1, filler='type: "xavier"')
    L += conv(f"{name}_3x3", f"{name}_3x3_reduce", c3, 3, pad=1, filler='type: "xavier"')
    L += conv(f"{name}_5x5_reduce", bottom, c5r, 1, filler='type: "xavier"')
    L += conv(f"{name}_5x5", f"{name}_5x5_reduce", c5, 5, pad=2, filler='type: "xavier"')
    L += pool(f"{name}_pool", bottom, "MAX", 3, 1, pad=1)
    L += conv(f"{name}_pool_proj", f"{name}_pool", pp, 1, filler='type: "xavier"')
    L.append(f'''layer {{
  name: "{name}_output"
  type: "Concat"
  bottom: "{name}_1x1"
  bottom: "{name}_3x3"
  bottom: "{name}_5x5"
  bottom: "{name}_pool_proj"
  top: "{name}_output"
}}''')
    return L


def inception_small():
    L = data_layers("data/inception/images", "data/inception/mean.binaryproto", 32, 32, crop=112)
    L += conv("conv1", "data", 64, 7, pad=3, stride=2, filler='type: "xavier"')
    L += pool("pool1", "conv1", "MAX", 3, 2)
    L += ['''layer {
  name: "norm1"
  type: "LRN"
  bottom: "pool1"
  top: "norm1"
  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }
}''']
    L += conv("conv2_reduce", "norm1", 64, 1, filler='type: "xavier"')
    L += conv("conv2", "conv2_reduce", 192, 3, pad=1, filler='type: "xavier"')
    L += pool("pool2", "conv2", "MAX", 3, 2)
    L += inception("inc3a", "pool2", 64, 96, 128, 16, 32, 32)
    L += inception("inc3b", "inc3a_output", 128, 128, 192, 32, 96, 64)
    L += pool("pool3", "inc3b_output", "MAX", 3, 2)
    L += inception("inc4a", "pool3", 192, 96, 208, 16, 48, 64)
    L += pool("pool4", "inc4a_output", "AVE", 0, 0, global_=True)
    L += ['layer { name: "drop" type: "Dropout" bottom: "pool4" top: "pool4" dropout_param { dropout_ratio: 0.4 } }']
    L += tail("pool4", 100)
    head = ("# A small GoogLeNet-style net (GoogLeNet's stem, inceptions 3a, 3b, 4a, global average\n"
            "# pooling) for 112x112 crops, batch 32; written by tools/gen_models.py for the benchmark.\n")
    return head + 'name: "InceptionSmall"\n' + "\n".join(L) + "\n"


def main():
    for rel, text in (("models/nin_cifar10/nin_cifar10_train_test.prototxt", nin()),
                      ("models/inception_small/inception_small_train_test.prototxt", inception_small())):
        path = os.path.join(ROOT, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(path)


if __name__ == "__main__":
    main()
